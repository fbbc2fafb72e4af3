"""Re-grading a tool episode's final artifact in a clean sandbox.

An environment the policy acted in can be tampered with: the worker runs whatever the policy
asked for in its own directory, and a verifier that reads that directory (or trusts the
worker's verdict) can be fooled by a planted file, such as an expected-answer file written
next to the answer. ``SandboxRegrader`` scores the episode a second time where the policy
never was.

The final artifact is a fixed list of ``files``: relative paths inside the worker's working
directory (``SubprocessSession.directory``, where its cwd is), read by ``collect`` once the
episode has ended and the in-environment verifier has scored it, before the worker is
killed and its directory removed. Only regular files count: a missing file, a symlink
(not followed) or a path that leaves the directory through a symlinked folder is left out
of the artifact, so the clean verifier sees it missing. A file over ``max_bytes`` is refused
(``RegradeError``).

``grade`` runs ``argv`` once on the ``SandboxFleet`` (a process or container runner, under
the fleet's limits) in a fresh, empty job directory that receives the artifact's files plus
the task's own verifier inputs (``inputs(task)``: the verifier script, its data); where both
name a file, the input wins, so the policy cannot replace the verifier. Nothing else of the
worker's directory travels. The program reads ``{"task": <task id>}`` as JSON on stdin and
prints its reward as the last line of stdout. A program that does not complete, or whose
last line is no finite number, raises ``RegradeError``.

``grade(task, artifact, cancel=flag)`` stops the verifier once ``flag.is_set()``: the fleet
kills its process group (and any process carrying its job marker) and raises
``SandboxCancelled``.

The regrader knows tasks only by shape (``task.id``), so this module needs neither dew nor
JAX; ``dew.sessions.regrade.Regrade`` wraps it for ``dew.rollout``'s
``EnvironmentSource(regrade=)`` and the trainer's ``EpisodeRollout(regrade=)``, which drop
the sample when the two rewards disagree.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.outcome import Verdict
from dew.sandbox.program import Program, _check_relative

__all__ = ["RegradeError", "SandboxRegrader"]

_TAIL = 300


class RegradeError(RuntimeError):
    """The clean sandbox could not give a reward (an oversized artifact, a verifier that did
    not complete or printed no number)."""


def _read_regular(directory: str, name: str, limit: int) -> bytes | None:
    """The bytes of regular file ``name`` under ``directory``; None when missing, a symlink,
    not a regular file, or reached through a folder outside ``directory``."""
    root = os.path.realpath(directory)
    path = os.path.join(root, name)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != root and not parent.startswith(root + os.sep):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            return None
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        data = file.read(limit + 1)
    if len(data) > limit:
        raise RegradeError(f"artifact {name!r}: expected at most {limit} bytes, got more")
    return data


class SandboxRegrader:
    """Collect an episode's final artifact and score it again in a fresh sandbox.

    Args:
      fleet: the ``SandboxFleet`` the clean verifier runs on (its runner and limits).
      argv: the clean verifier's command line (no shell), run in the job directory.
      files: the artifact, relative paths in the worker's directory (at least one).
      inputs: ``task -> {path: str | bytes}``, the task's own verifier files, or a fixed
        mapping, or None (no files besides the artifact).
      max_bytes: the largest artifact file read.
    """

    def __init__(
        self,
        fleet: SandboxFleet,
        argv: Sequence[str],
        files: Sequence[str],
        inputs: Mapping[str, str | bytes]
        | Callable[[Any], Mapping[str, str | bytes]]
        | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> None:
        if not callable(getattr(fleet, "run", None)):
            raise TypeError(f"fleet: expected a SandboxFleet, got {type(fleet).__name__}")
        Program({}, argv)  # refuses an argv it could not run, naming Program.argv
        if isinstance(files, str | bytes) or not files:
            raise ValueError(f"files: expected a nonempty list of relative paths, got {files!r}")
        for name in files:
            if not isinstance(name, str):
                raise ValueError(f"files: expected relative paths, got {name!r}")
            _check_relative(name)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes: expected an integer >= 1, got {max_bytes!r}")
        if not (inputs is None or isinstance(inputs, Mapping) or callable(inputs)):
            raise TypeError(
                f"inputs: expected a mapping or a callable of the task, got {type(inputs).__name__}"
            )
        self.fleet = fleet
        self.argv = tuple(argv)
        self.files = tuple(files)
        self.inputs = inputs
        self.max_bytes = max_bytes

    def collect(self, task: Any, environment: Any) -> dict[str, bytes]:
        """The artifact of an open episode: ``{path: bytes}`` for each of ``files`` that is a
        regular file in ``environment.directory`` (missing ones left out).

        Raises:
          TypeError: ``environment`` has no open worker directory.
          RegradeError: a file larger than ``max_bytes``.
        """
        del task
        directory = getattr(environment, "directory", None)
        if not isinstance(directory, str) or not os.path.isdir(directory):
            raise TypeError(
                "environment: expected an open SubprocessSession (a worker directory), got "
                f"{type(environment).__name__} with directory {directory!r}"
            )
        artifact = {}
        for name in self.files:
            data = _read_regular(directory, name, self.max_bytes)
            if data is not None:
                artifact[name] = data
        return artifact

    def program(self, task: Any, artifact: Mapping[str, bytes]) -> Program:
        """The clean verifier's ``Program``: the artifact's files, then the task's inputs
        over them, ``argv``, and ``{"task": id}`` on stdin (a non-JSON id is sent as null)."""
        inputs = self.inputs(task) if callable(self.inputs) else self.inputs or {}
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs: expected a mapping of files, got {type(inputs).__name__}")
        files: dict[str, str | bytes] = {
            name: data for name, data in artifact.items() if name in self.files
        }
        files.update(inputs)
        ident = getattr(task, "id", None)
        ident = ident if isinstance(ident, int | str) and not isinstance(ident, bool) else None
        return Program(files, self.argv, stdin=json.dumps({"task": ident}))

    def grade(self, task: Any, artifact: Mapping[str, bytes], cancel: Any = None) -> float:
        """The reward the clean verifier prints for ``artifact``. Once ``cancel`` (anything
        with ``is_set()``) is set, the verifier's processes are killed and its job directory
        removed within a poll (about 50 ms).

        Raises:
          RegradeError: the verifier did not complete, or its last stdout line is no finite
            number.
          SandboxCancelled: ``cancel`` stopped the verifier.
        """
        (outcome,) = self.fleet.run([self.program(task, artifact)], cancel=cancel)
        if outcome.verdict is not Verdict.COMPLETED:
            tail = outcome.stderr[-_TAIL:].decode("utf-8", "replace").strip()
            raise RegradeError(f"clean verifier: expected it to complete, got "
                               f"{outcome.verdict.name} (exit {outcome.exit_code}): {tail!r}")  # fmt: skip
        lines = outcome.stdout.decode("utf-8", "replace").strip().splitlines()
        last = lines[-1].strip() if lines else ""
        try:
            reward = float(last)
        except ValueError:
            reward = math.nan
        if not math.isfinite(reward):
            raise RegradeError(
                f"clean verifier: expected a finite number as its last line, got {last[:_TAIL]!r}"
            )
        return reward

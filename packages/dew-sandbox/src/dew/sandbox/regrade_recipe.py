"""``source.regrade`` in ``dew train grpo``/``ppo`` and ``dew chain`` configs of tool episodes.

``dew`` may not import ``dew.sandbox``: it finds ``sandbox_regrader`` below by its entry
point (group ``dew.recipes``, name ``sandbox_regrader``) and hands it the section::

    source:
      kind: environment
      command: [python3, worker.py]
      regrade:
        command: [python3, verify.py]       # the clean verifier's argv, run in its job dir
        files: [answer.txt]                 # the artifact: files of the worker's directory
        inputs: {verify.py: /abs/verify.py} # the task's own verifier files (host paths)
        runner: process                     # or container (then a container section)
        workers: 2
        limits: {cpu_seconds: 10, deadline_seconds: 30}
        max_bytes: 1048576                  # the largest artifact file read

``sandbox_regrader(args)`` checks every key at once (``inputs`` files are read now, so a
missing one is refused before anything starts) and returns a context manager: entering it
starts the fleet and yields a ``SandboxRegrader`` (``dew.sandbox.regrade``); leaving it
closes the fleet. Errors are ``ValueError`` whose message starts with the key inside the
section (``files: expected ...``), so the caller can prefix ``source.regrade.``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.program import Program
from dew.sandbox.recipe import _limits, _mapping, _runner, _strings, _unknown
from dew.sandbox.regrade import SandboxRegrader

__all__ = ["REGRADE_KEYS", "sandbox_regrader"]

#: The keys ``source.regrade`` may hold.
REGRADE_KEYS = ("command", "files", "inputs", "runner", "workers", "limits", "container",
                "max_bytes")  # fmt: skip


def _inputs(value: Any) -> dict[str, bytes]:
    """``{job path: host path}`` read now into ``{job path: bytes}``."""
    out = {}
    for name, path in _mapping(value, "inputs").items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"inputs.{name}: expected a file path, got {path!r}")
        try:
            Program({name: b""}, ["true"])
        except ValueError:
            raise ValueError(f"inputs.{name}: expected a relative job path, got {name!r}") from None
        try:
            with open(path, "rb") as file:
                out[name] = file.read()
        except OSError as err:
            raise ValueError(f"inputs.{name}: expected a readable file, got {path!r} "
                             f"({err.strerror})") from None  # fmt: skip
    return out


@contextlib.contextmanager
def _opened(make_runner: Any, limits: Any, workers: int, **options: Any) -> Iterator[Any]:
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    with SandboxFleet(make_runner(), limits=limits, workers=workers) as fleet:
        yield SandboxRegrader(fleet, **options)


def sandbox_regrader(
    args: Mapping[str, Any] | None,
) -> contextlib.AbstractContextManager[SandboxRegrader]:
    """A context manager yielding a ``SandboxRegrader`` on a fresh ``SandboxFleet`` made from
    ``args`` (the keys of ``REGRADE_KEYS``: ``command`` and ``files`` required; runner
    ``process``, 2 workers, ``SandboxLimits()``, no inputs and 1 MiB by default).

    Raises:
      ValueError: an unknown or missing key, a bad value, an unreadable input file; the
        message starts with the key inside ``args``.
    """
    given = _mapping(args, "regrade")
    _unknown(given, REGRADE_KEYS, "")
    command = _strings(given.get("command"), "command", "a nonempty list of strings (an argv)")
    files = _strings(given.get("files"), "files", "a nonempty list of relative paths")
    for name in files:
        try:
            Program({name: b""}, ["true"])
        except ValueError:
            raise ValueError(f"files: expected relative paths, got {name!r}") from None
    inputs = _inputs(given.get("inputs"))
    make_runner = _runner(given)
    workers = given.get("workers", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
    max_bytes = given.get("max_bytes", 1 << 20)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes: expected an integer >= 1, got {max_bytes!r}")
    return _opened(make_runner, _limits(given.get("limits")), workers, argv=command,
                   files=files, inputs=inputs, max_bytes=max_bytes)  # fmt: skip

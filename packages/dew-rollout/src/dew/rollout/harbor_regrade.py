"""Re-grading a Harbor trial with Harbor's own ``harbor trial regrade``.

``HarborSource(regrade=HarborRegrade(...))`` re-grades every trial that came back with a
reward (COMPLETED, AGENT_ERROR, or TRUNCATED with a reward) by running, with the source's
harbor command and environment,

    harbor trial regrade <trials>/<session> -p <task dir> --trial-name <session>-regrade
        -o <trials> [-e <environment>] [--ve KEY=VALUE ...] <args...>

(Harbor 0.26.0, ``harbor/cli/trials.py::regrade`` and ``harbor/trial/regrade.py``). Harbor
copies the trial's ``agent/`` and ``artifacts/`` (what the agent left in the environment's
``/logs/artifacts``) into a new trial and runs the task's verifier in a *separate* verifier
environment against those recorded artifacts only, never the live agent environment. So
the task named by ``-p`` must declare ``[verifier] environment_mode = "separate"`` in its
``task.toml`` and grade from ``/logs/artifacts``; Harbor refuses any other task (exit 1).
``tasks`` may name a directory of such verifier tasks (Harbor picks the one whose name is
the trial's task name), so trials that ran a shared-mode verifier inside the agent's
environment are re-graded by a hardened copy of the task.

The regrade trial's ``result.json`` gives the clean reward (as ``harbor_trial.reward_of``
reads it). The counting and the decision are ``dew.rollout.sources.regrade.Regrade``'s, shared with
``EnvironmentSource``: a clean reward further than ``tolerance`` from the trial's makes the
session INFRA_ERROR (``regrade rejected: in-environment reward 1.0, clean sandbox 0.0``),
and so does a regrade that fails (``regrade failed: HarborRegradeError: ...``: a non-zero
exit without a usable result, a result with no reward or with an exception other than the
trial's own agent error, which Harbor carries over and then exits 1). Either way the
scheduler draws the sample again and never trains it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dew.checks import tolerance as check_tolerance
from dew.rollout.harbor_trial import Trial, reward_of
from dew.sessions.records import Task


class HarborRegradeError(RuntimeError):
    """``harbor trial regrade`` gave no clean reward (why is the message)."""


class RegradeCancelled(BaseException):
    """The session was cancelled while its trial was re-graded. A ``BaseException`` so
    that it passes the regrader's error handling uncounted; ``HarborSource`` turns it into
    a CANCELLED session."""


@dataclasses.dataclass(frozen=True)
class HarborRegrade:
    """How ``HarborSource`` re-grades its trials (module docstring).

    tolerance: the largest absolute difference between the trial's reward and the clean
      one that still agrees.
    tasks: a task directory, or a directory of task directories, passed as ``-p`` (Harbor
      matches the trial's task name); None: each trial's own task directory.
    environment: ``-e``, the verifier environment's type (None: Harbor's default, docker).
    verifier_env: ``--ve KEY=VALUE`` variables for the verifier.
    args: further ``harbor trial regrade`` options.
    timeout: seconds before a regrade is killed (it then fails); None: no limit.
    """

    tolerance: float = 0.0
    tasks: str | os.PathLike[str] | None = None
    environment: str | None = None
    verifier_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: Sequence[str] = ()
    timeout: float | None = None

    def __post_init__(self) -> None:
        check_tolerance(self.tolerance, "regrade.tolerance")
        if self.tasks is not None and not Path(self.tasks).is_dir():
            raise FileNotFoundError(f"regrade.tasks: {os.fspath(self.tasks)!r} is not a directory")
        if not isinstance(self.verifier_env, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.verifier_env.items()
        ):
            raise ValueError(f"regrade.verifier_env: expected a mapping of names to strings, "
                             f"got {self.verifier_env!r}")  # fmt: skip
        if isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args):
            raise ValueError(f"regrade.args: expected a list of strings, got {self.args!r}")
        if self.timeout is not None and not (
            isinstance(self.timeout, int | float) and self.timeout > 0
        ):
            raise ValueError(f"regrade.timeout: expected seconds > 0, got {self.timeout!r}")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A finished trial to re-grade: its process handle (which a cancel stops) and the
    exception type its own result recorded (None when it had none)."""

    trial: Trial
    exception: str | None


class HarborRegrader:
    """The regrader ``Regrade`` calls (``collect``, ``grade``) for one ``HarborSource``:
    ``command`` and ``env`` are the source's harbor command and extra environment,
    ``trials`` its trials directory."""

    def __init__(
        self, options: HarborRegrade, command: Sequence[str], trials: Path, env: Mapping[str, str]
    ) -> None:
        self.options = options
        self.command = list(command)
        self.trials = trials
        self.env = dict(env)

    def collect(self, task: Task, environment: Recorded) -> Recorded:
        """The finished trial itself: Harbor re-reads its record from the trials directory."""
        return environment

    def argv(self, session: str, directory: Path) -> list[str]:
        """The ``harbor trial regrade`` command line of trial ``session`` of task
        ``directory``."""
        o = self.options
        argv = [*self.command, "trial", "regrade", str(self.trials / session),
                "-p", os.fspath(o.tasks if o.tasks is not None else directory),
                "--trial-name", f"{session}-regrade", "-o", str(self.trials)]  # fmt: skip
        if o.environment is not None:
            argv += ["-e", o.environment]
        for name, value in o.verifier_env.items():
            argv += ["--ve", f"{name}={value}"]
        return [*argv, *o.args]

    def grade(self, task: Task, artifact: Recorded) -> float:
        """The regrade trial's reward.

        Raises:
          HarborRegradeError: no usable result (module docstring).
          RegradeCancelled: the session was cancelled meanwhile.
        """
        trial = artifact.trial
        name = f"{trial.session}-regrade"
        log = self.trials / f"{name}.log"
        trial.start(self.argv(trial.session, trial.directory), log, self.env)
        code = trial.wait(self.options.timeout)
        if trial.cancelled:
            raise RegradeCancelled()
        if code is None:
            raise HarborRegradeError(f"ran past {self.options.timeout} s and was killed")
        path = self.trials / name / "result.json"
        tail = log.read_text(errors="replace")[-400:].strip() if log.exists() else ""
        try:
            result: Any = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise HarborRegradeError(f"harbor trial regrade exited {code} without a readable "
                                     f"{path} ({error}): {tail!r}") from None  # fmt: skip
        info = result.get("exception_info") if isinstance(result, Mapping) else None
        kind = info.get("exception_type") if isinstance(info, Mapping) else None
        if info is not None and kind != artifact.exception:
            message = str(info.get("exception_message", "")) if isinstance(info, Mapping) else ""
            raise HarborRegradeError(f"{kind}: {message[:300]}")
        reward, _, problem = reward_of(result if isinstance(result, Mapping) else {})
        if reward is None:
            raise HarborRegradeError(f"exited {code}: {problem}: {tail!r}")
        return reward


__all__ = ["HarborRegrade", "HarborRegradeError", "HarborRegrader", "RegradeCancelled"]

"""Re-grading a tool episode in a clean sandbox before its session is handed over.

``EnvironmentSource(regrade=...)`` takes a regrader: anything with

- ``collect(task, environment) -> artifact``: the episode's final artifact, read while the
  environment is still open (after the in-environment verifier scored it);
- ``grade(task, artifact) -> float``: the reward of that artifact scored again where the
  policy never acted, called after the environment exited.

``dew.sandbox.regrade.SandboxRegrader`` is one: its artifact is a list of files in the
worker's directory, scored by a verifier program on a fresh ``SandboxFleet`` job directory
(see that module for what travels and what does not).

``Regrade`` wraps the regrader for one source: a session with a reward whose re-graded
reward differs from it by more than ``tolerance`` is rejected: it resolves INFRA_ERROR with
no reward and a ``detail`` starting ``regrade rejected:``, so the scheduler's admission
treats it as a failed attempt (resubmitted, never trained). A regrader that raises, in
``collect`` or ``grade``, fails the session the same way (``regrade failed:``). Sessions
without a reward (errors, cancellations) are not re-graded.

``counts`` (a copy, safe from any thread) holds ``regraded`` (sessions re-graded),
``agreed``, ``rejected`` (the rewards disagreed) and ``failed`` (the regrader raised).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

from dew.rollout.sources._common import finite_reward
from dew.sessions.records import Session, Status, Task

#: The names ``Regrade.counts`` holds.
COUNTS = ("regraded", "agreed", "rejected", "failed")


class Regrade:
    """A regrader (``collect`` and ``grade``) and the tally of what it decided.

    Args:
      regrader: see the module docstring.
      tolerance: the largest absolute difference between the two rewards that still agrees.
    """

    def __init__(self, regrader: Any, tolerance: float = 1e-6) -> None:
        for name in ("collect", "grade"):
            if not callable(getattr(regrader, name, None)):
                raise TypeError(f"regrade: expected an object with collect(task, environment) "
                                f"and grade(task, artifact), got {type(regrader).__name__}")  # fmt: skip
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, int | float)
            or not (math.isfinite(tolerance) and tolerance >= 0)
        ):
            raise ValueError(f"regrade_tolerance: expected a finite number >= 0, got {tolerance!r}")
        self.regrader = regrader
        self.tolerance = float(tolerance)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTS, 0)

    @property
    def counts(self) -> dict[str, int]:
        """``regraded``, ``agreed``, ``rejected``, ``failed`` so far (a copy)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    def collect(self, task: Task, environment: Any) -> Any:
        """The regrader's artifact of the open ``environment`` (its errors propagate)."""
        return self.regrader.collect(task, environment)

    def failed(self, session: Session, error: BaseException) -> Session:
        """``session`` failed by a regrader that raised ``error`` (counted)."""
        self._count("regraded", "failed")
        return _dropped(session, f"regrade failed: {type(error).__name__}: {error}")

    def settle(self, task: Task, session: Session, artifact: Any) -> Session:
        """``session`` unchanged when its reward is None or the clean reward agrees with it;
        otherwise the session rejected (INFRA_ERROR, no reward). Every re-grade is counted."""
        if session.reward is None:
            return session
        try:
            clean = finite_reward(self.regrader.grade(task, artifact), "regrade")
        except Exception as err:  # noqa: BLE001 - a failed re-grade drops the sample
            return self.failed(session, err)
        if abs(clean - float(session.reward)) <= self.tolerance:
            self._count("regraded", "agreed")
            return session
        self._count("regraded", "rejected")
        return _dropped(session, f"regrade rejected: in-environment reward {session.reward!r}, "
                                 f"clean sandbox {clean!r}")  # fmt: skip


def _dropped(session: Session, detail: str) -> Session:
    return dataclasses.replace(session, status=Status.INFRA_ERROR, reward=None, detail=detail)


__all__ = ["COUNTS", "Regrade"]

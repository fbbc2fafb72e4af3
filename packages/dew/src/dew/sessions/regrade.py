"""Re-grading a scored episode in a clean sandbox, shared by both ways of collecting them.

A regrader is anything with

- ``collect(task, environment) -> artifact``: the episode's final artifact, read while the
  environment is still open (after the in-environment verifier scored it);
- ``grade(task, artifact, cancel=None) -> float``: the reward of that artifact scored again
  where the policy never acted, called after the environment exited. ``cancel`` (anything
  with ``is_set()``) is passed only when the caller can be cancelled: once it is set the
  regrader stops its work promptly and raises.

``dew.sandbox.regrade.SandboxRegrader`` is one: its artifact is a list of files in the
worker's directory, scored by a verifier program on a fresh ``SandboxFleet`` job directory,
whose process is killed when ``cancel`` is set.

``Regrade`` wraps the regrader for one collector. ``verdict(task, reward, artifact)`` is None
when the clean reward is within ``tolerance`` of ``reward``, else the reason the episode
must not train: ``regrade rejected: in-environment reward 1.0, clean sandbox 0.0``, or
``regrade failed: <error>`` when the regrader raised (``failure(error)`` words a failed
``collect`` the same way). Who drops the episode and how is the collector's choice:
``dew-rollout``'s ``EnvironmentSource`` turns the session INFRA_ERROR (``settle``,
``failed``), so the scheduler draws it again; the trainer's own ``EpisodeRollout`` turns the
episode ERROR with no reward, so its rows are masked. A cancel that arrives during ``grade``
raises ``CancelledError`` and counts nothing.

``counts`` (a copy, safe from any thread) holds ``regraded`` (episodes re-graded),
``agreed``, ``rejected`` (the rewards disagreed) and ``failed`` (the regrader raised);
``metrics()`` gives them as ``regrade/<name>`` numbers for a log record.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import CancelledError
from typing import Any

from dew.checks import finite_float
from dew.checks import tolerance as check_tolerance
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
        self.regrader = regrader
        self.tolerance = check_tolerance(tolerance, "regrade_tolerance")
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTS, 0)

    @property
    def counts(self) -> dict[str, int]:
        """``regraded``, ``agreed``, ``rejected``, ``failed`` so far (a copy)."""
        with self._lock:
            return dict(self._counts)

    def metrics(self) -> dict[str, float]:
        """``counts`` as ``regrade/<name>`` numbers."""
        return {f"regrade/{name}": float(n) for name, n in self.counts.items()}

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    def collect(self, task: Task, environment: Any) -> Any:
        """The regrader's artifact of the open ``environment`` (its errors propagate)."""
        return self.regrader.collect(task, environment)

    def failure(self, error: BaseException) -> str:
        """The reason an episode whose regrader raised ``error`` is dropped (counted)."""
        self._count("regraded", "failed")
        return f"regrade failed: {type(error).__name__}: {error}"

    def verdict(self, task: Task, reward: float, artifact: Any, cancel: Any = None) -> str | None:
        """None when the clean reward of ``artifact`` agrees with ``reward``, else why the
        episode is dropped (counted either way).

        Raises:
          CancelledError: ``cancel`` was set before or while the regrader graded.
        """
        if cancel is not None and cancel.is_set():
            raise CancelledError("re-grading cancelled")
        try:
            if cancel is None:
                clean = finite_float(self.regrader.grade(task, artifact), "regrade")
            else:
                clean = finite_float(self.regrader.grade(task, artifact, cancel=cancel), "regrade")
        except Exception as err:  # noqa: BLE001 - a failed re-grade drops the sample
            if cancel is not None and cancel.is_set():
                raise CancelledError("re-grading cancelled") from err
            return self.failure(err)
        if abs(clean - float(reward)) <= self.tolerance:
            self._count("regraded", "agreed")
            return None
        self._count("regraded", "rejected")
        return f"regrade rejected: in-environment reward {reward!r}, clean sandbox {clean!r}"

    def failed(self, session: Session, error: BaseException) -> Session:
        """``session`` failed by a regrader that raised ``error`` (counted)."""
        return _dropped(session, self.failure(error))

    def settle(self, task: Task, session: Session, artifact: Any, cancel: Any = None) -> Session:
        """``session`` unchanged when its reward is None or the clean reward agrees with it;
        otherwise the session rejected (INFRA_ERROR, no reward). Raises ``CancelledError``
        as ``verdict`` does."""
        if session.reward is None:
            return session
        detail = self.verdict(task, session.reward, artifact, cancel)
        return session if detail is None else _dropped(session, detail)


def _dropped(session: Session, detail: str) -> Session:
    return dataclasses.replace(session, status=Status.INFRA_ERROR, reward=None, detail=detail)


__all__ = ["COUNTS", "Regrade"]

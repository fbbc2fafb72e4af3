"""One episode slot of a collection: its environment, its record and its lifecycle.

``open`` creates the environment from the factory, enters it and resets it; ``send`` passes a
validated action to ``step``; ``finish`` ends the episode with a status, runs the verifier
while the environment is still open and then releases it (a failed release discards the
episode: status ERROR, no reward); ``artifact`` and ``regrade`` re-grade a scored episode
in a clean sandbox around that release (``dew.sessions.regrade``); ``abort`` releases it
under the exception that ended the collection. ``tool_seconds`` adds up the time spent in
the environment.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dew.rollouts.episodes.protocol import (
    Action,
    EnvironmentFactory,
    Episode,
    EpisodeId,
    EpisodeStatus,
    Observation,
    Transition,
    Verifier,
    as_observation,
)
from dew.sessions.records import Task


class VerifierError(ValueError):
    """A verifier returned something other than a finite float."""


class Slot:
    """The state of one episode while it is collected (host side)."""

    def __init__(
        self, episode_id: EpisodeId, group: int, origin: Any, index: int = 0, journal: Any = None
    ) -> None:
        self.id = episode_id
        self.group = group
        self.origin = origin
        self.index = index
        self.journal = journal
        # what a journal recovered: completed turns to replay, a pending draw, the ending
        self.replay: list[tuple[Action, Observation, bytes | None]] = []
        self.pending_action: Action | None = None
        self.ending: tuple[EpisodeStatus, str, float | None] | None = None
        self.first: Observation | None = None
        self.transitions: list[Transition] = []
        self.status = EpisodeStatus.RUNNING
        self.detail = ""
        self.reward: float | None = None
        self.environment: Any = None
        self._manager: Any = None
        self.tool_seconds = 0.0

    # ------------------------------------------------------------------ views
    @property
    def running(self) -> bool:
        return self.status is EpisodeStatus.RUNNING

    @property
    def is_open(self) -> bool:
        return self._manager is not None

    @property
    def turns(self) -> int:
        return len(self.transitions)

    @property
    def context(self) -> np.ndarray:
        last = self.transitions[-1].observation if self.transitions else self.first
        assert last is not None and last.context is not None
        return np.asarray(last.context)

    def episode(self) -> Episode:
        return Episode(
            id=self.id,
            first=self.first,
            transitions=tuple(self.transitions),
            status=self.status,
            detail=self.detail,
            reward=self.reward,
            origin=self.origin,
        )

    # ------------------------------------------------------------------ lifecycle
    def restore(self, record: Any) -> None:
        """Take over a journal's record of this slot (see ``EpisodeJournal``)."""
        self.replay = list(record.completed)
        self.pending_action = record.pending
        self.ending = record.ending
        if record.ending is not None and record.first is not None:
            self.first = record.first  # finished and verified: no environment needed

    def open(self, factory: EnvironmentFactory) -> None:
        if self.ending is not None and self.first is not None:
            return
        start = time.perf_counter()
        try:
            manager = factory(self.id)
            entered = manager.__enter__()
            self._manager = manager
            self.environment = manager if entered is None else entered
            self.first = as_observation(self.environment.reset(), "Environment.reset()")
            if self.journal is not None:
                for name in ("get_state", "set_state"):
                    if not callable(getattr(self.environment, name, None)):
                        raise TypeError(
                            f"environment: a journal needs get_state() and set_state(), "
                            f"{type(self.environment).__name__} has no {name}()"
                        )
                self.journal.opened(self.index, self.first)
                snapshots = [snap for _, _, snap in self.replay if snap is not None]
                if snapshots:
                    self.environment.set_state(snapshots[-1])
        finally:
            self.tool_seconds += time.perf_counter() - start
        if self.first.status.terminal:
            self.status, self.detail = self.first.status, self.first.detail

    def send(self, action: Action) -> Observation:
        turn = len(self.transitions)
        if self.journal is not None:
            self.journal.pending(self.index, turn, action)
        start = time.perf_counter()
        try:
            reply = as_observation(self.environment.step(action), "Environment.step()")
            if self.journal is not None:
                snapshot = bytes(self.environment.get_state())
                self.journal.completed(self.index, turn, action, reply, snapshot)
        finally:
            self.tool_seconds += time.perf_counter() - start
        self.transitions.append(Transition(action, reply))
        if reply.status.terminal:
            self.status, self.detail = reply.status, reply.detail
        return reply

    def record_truncated(self, action: Action, detail: str) -> None:
        """A turn that hit its budget: kept in the record, never sent to the environment."""
        reply = Observation(None, EpisodeStatus.TRUNCATED, detail)
        if self.journal is not None:
            self.journal.completed(self.index, len(self.transitions), action, reply, None)
        self.transitions.append(Transition(action, reply))
        self.status, self.detail = EpisodeStatus.TRUNCATED, detail

    def end(self, status: EpisodeStatus, detail: str) -> None:
        self.status, self.detail = status, detail

    def replayed(self) -> Transition | None:
        """The recorded transition of the next turn, appended, or None when there is none."""
        turn = len(self.transitions)
        if turn >= len(self.replay):
            return None
        action, reply, _ = self.replay[turn]
        transition = Transition(action, reply)
        self.transitions.append(transition)
        if reply.status.terminal:
            self.status, self.detail = reply.status, reply.detail
        return transition

    def commit_ending(self) -> None:
        if self.journal is not None:
            self.journal.ended(self.index, self.status, self.detail, self.reward)

    def verify(self, verifier: Verifier) -> None:
        """Score the ended episode while its environment is open (raises on a bad score)."""
        value = verifier(self.episode())
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool | np.bool_) or not math.isfinite(number):
            raise VerifierError(
                f"verifier: expected a finite float for episode {self.id} "
                f"({self.status.name}), got {value!r}"
            )
        self.reward = number

    def collect(self, regrade: Any) -> tuple[Any, BaseException | None]:
        """``regrade.collect`` of the scored episode, its environment still open: the pair
        ``(artifact, None)``, or ``(None, error)`` when collecting raised."""
        try:
            return regrade.collect(Task(self.id.task), self.environment), None
        except Exception as err:  # noqa: BLE001 - counted as a failed re-grade
            return None, err

    def regrade(self, regrade: Any, artifact: Any, failure: BaseException | None) -> None:
        """Score ``artifact`` again (after the release); a clean reward that disagrees, or a
        regrader that raised (``failure`` included), makes the episode ERROR with no reward
        and the reason as its detail. An episode the release failed is left as it is."""
        if self.reward is None or self.status is EpisodeStatus.ERROR:
            return
        if failure is not None:
            reason: str | None = regrade.failure(failure)
        else:
            reason = regrade.verdict(Task(self.id.task), self.reward, artifact)
        if reason is not None:
            self.status, self.detail, self.reward = EpisodeStatus.ERROR, reason, None

    def release(self) -> None:
        """Exit the environment normally; a failure discards the episode (status ERROR)."""
        manager, self._manager = self._manager, None
        if manager is None:
            return
        start = time.perf_counter()
        try:
            manager.__exit__(None, None, None)
        except Exception as err:
            self.status = EpisodeStatus.ERROR
            self.detail = f"release failed: {type(err).__name__}: {err}"
            self.reward = None
        finally:
            self.tool_seconds += time.perf_counter() - start

    def abort(self, error: BaseException) -> None:
        """Exit the environment under ``error``; errors while exiting are not raised."""
        manager, self._manager = self._manager, None
        if manager is None:
            return
        start = time.perf_counter()
        try:
            manager.__exit__(type(error), error, error.__traceback__)
        except BaseException:  # noqa: BLE001 - the original error is what the caller raises
            pass
        finally:
            self.tool_seconds += time.perf_counter() - start


__all__ = ["Slot", "VerifierError"]

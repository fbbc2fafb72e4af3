"""Admission: turning finished rollouts of one batch into complete groups (host side).

By status:

- COMPLETED and AGENT_ERROR are admitted with their reward (a missing reward is a source bug
  and raises);
- TRUNCATED is admitted (``pack``'s ``truncation`` decides how it trains), except under
  ``"score"`` without a reward: its verifier never ran, so it is a failed attempt;
- INFRA_ERROR and CANCELLED are failed attempts: the sample is submitted again until it has
  failed ``max_attempts`` times, then its group is abandoned;
- a rollout whose oldest call is more than ``max_lag`` updates behind is discarded and
  submitted again (not a failure: the new attempt runs on fresher weights);
- with ``timeout``, a rollout running longer is cancelled and submitted again as a failure.

A group completes when ``groups`` of its samples are admitted (the rest of an oversampled
group are cancelled). With ``max_draws > 1`` (DAPO's dynamic sampling) a group of two or more
whose admitted samples all train on the same reward carries no signal: its samples are
drawn again (fresh seeds: each sample's attempt counts up), at most ``max_draws`` rounds in
all; a group still uniform at its last round completes as it is (counted ``filled``). It
then joins the batch only if every group admitted so far fits ``rows`` rows (the packer's
``rows_needed``: chains placed in token rows, or one row per flow sample); otherwise it is
cut. A group that cannot fit ``rows`` rows on its own
raises. With ``admit=M`` the batch closes after ``M`` complete groups and the others are
cancelled. A future that raises (the source itself failed) propagates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait
from typing import Any

from dew.rollout.scheduler.work import (
    ABANDONED,
    COMPLETE,
    CUT,
    DROPPED,
    OPEN,
    BatchWork,
    Entry,
)
from dew.sessions.records import Session, Status

Resubmit = Callable[[BatchWork, int, int], None]
Cancel = Callable[[Entry], None]


@dataclasses.dataclass(frozen=True)
class Rules:
    """The admission settings of a scheduler (checked by it)."""

    groups: int
    rows: int
    max_lag: int
    max_attempts: int
    truncation: str
    timeout: float | None
    admit: int | None
    max_draws: int = 1


class Admission:
    """Collect one batch: wait for its rollouts and admit, resubmit, abandon or cut."""

    def __init__(
        self,
        rules: Rules,
        packer: Any,
        resubmit: Resubmit,
        cancel: Cancel,
        tick: Callable[[BatchWork], None] | None = None,
    ) -> None:
        self.rules = rules
        self.packer = packer
        self.resubmit = resubmit
        self.cancel = cancel
        self.tick = tick

    def expire(self, work: BatchWork, updates: int) -> None:
        """Cancel and resubmit rollouts past the timeout, or submitted past ``max_lag``."""
        now = work.now()
        for entry in sorted(work.entries.values(), key=lambda e: (e.group, e.sample)):
            stale = updates - entry.version > self.rules.max_lag
            late = self.rules.timeout is not None and now - entry.started > self.rules.timeout
            if not (stale or late):
                continue
            work.pop(entry.future)
            self.cancel(entry)
            work.counts["cancelled"] += 1
            if stale:
                work.counts["resubmitted/stale"] += 1
                self.resubmit(work, entry.group, entry.sample)
            else:
                self._failed(work, entry, "timeout")

    def collect(self, work: BatchWork, updates: int) -> None:
        """Wait until every group of ``work`` is complete, cut or abandoned (or ``admit``
        groups are complete)."""
        if self.rules.max_draws > 1 and (self.rules.admit or 0) > len(work.groups):
            raise ValueError(
                f"dynamic_sampling_groups: expected at most the {len(work.groups)} tasks of "
                f"batch {work.index}, got {self.rules.admit}"
            )
        while work.open_groups():
            self.expire(work, updates)
            futures = work.futures()
            if not futures:
                raise RuntimeError(f"scheduler: batch {work.index} has open groups but no work")
            timeout = None
            if self.rules.timeout is not None:
                oldest = min(e.started for e in work.entries.values())
                timeout = max(0.0, oldest + self.rules.timeout - work.now()) + 1e-3
            done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
            entries = [work.entries.get(id(f)) for f in done]
            for entry in sorted((e for e in entries if e is not None),
                                key=lambda e: (e.group, e.sample)):  # fmt: skip
                work.pop(entry.future)
                try:
                    session = entry.future.result()
                except CancelledError:
                    session = Session(task=work.groups[entry.group].task.id,
                                      status=Status.CANCELLED, detail="future cancelled")  # fmt: skip
                self._handle(work, entry, session, updates)
            if self.tick is not None:
                self.tick(work)

    # -- one finished rollout -------------------------------------------------------------

    def _handle(self, work: BatchWork, entry: Entry, session: Session, updates: int) -> None:
        group = work.groups[entry.group]
        if group.state != OPEN:
            return
        if not isinstance(session, Session):
            raise TypeError(
                f"source: expected a Session from its future, got {type(session).__name__}"
            )
        status = session.status
        if status in (Status.INFRA_ERROR, Status.CANCELLED):
            self._failed(work, entry, status.value)
            return
        if (
            status is Status.TRUNCATED
            and self.rules.truncation == "score"
            and session.reward is None
        ):
            self._failed(work, entry, "truncated_unscored")
            return
        if status in (Status.COMPLETED, Status.AGENT_ERROR) and session.reward is None:
            raise ValueError(
                f"source: task {group.task.id!r} sample {entry.sample} ended {status.name} "
                "without a reward (Session.reward is None)"
            )
        versions = session.policy_versions()
        lag = updates - min(versions) if versions else 0
        if lag > self.rules.max_lag:
            work.counts["resubmitted/stale"] += 1
            self.resubmit(work, entry.group, entry.sample)
            return
        group.admitted[entry.sample] = dataclasses.replace(
            session, task=group.task.id, group=entry.group, sample=entry.sample,
            attempt=entry.attempt,
        )  # fmt: skip
        group.latencies[entry.sample] = work.now() - entry.started
        if len(group.admitted) >= self.rules.groups:
            self._drawn(work, entry.group)

    def _failed(self, work: BatchWork, entry: Entry, cause: str) -> None:
        group = work.groups[entry.group]
        group.failures[entry.sample] += 1
        if group.failures[entry.sample] >= self.rules.max_attempts:
            group.state = ABANDONED
            work.counts["abandoned"] += 1
            self._stop_group(work, entry.group)
            return
        work.counts[f"resubmitted/{cause}"] += 1
        self.resubmit(work, entry.group, entry.sample)

    def _stop_group(self, work: BatchWork, group: int) -> None:
        for other in work.running(group):
            work.pop(other.future)
            self.cancel(other)
            work.counts["cancelled"] += 1

    def _drawn(self, work: BatchWork, index: int) -> None:
        """A round of group ``index`` is in: complete it, or (uniform, under dynamic
        sampling, rounds left) draw its samples again."""
        group = work.groups[index]
        self._stop_group(work, index)  # oversampled samples still running
        keep = sorted(group.admitted)[: self.rules.groups]
        group.admitted = {s: group.admitted[s] for s in keep}
        if self.rules.max_draws > 1:
            scores = {_score(group.admitted[s], self.rules.truncation) for s in keep}
            uniform = len(keep) > 1 and len(scores) == 1
            work.counts["drawn"] += 1
            work.counts["uniform"] += uniform
            if uniform and group.draws < self.rules.max_draws:
                group.draws += 1
                group.admitted, group.latencies = {}, {}
                for sample in range(work.samples):
                    self.resubmit(work, index, sample)
                return
            work.counts["filled"] += uniform
        self._complete(work, index)

    def _complete(self, work: BatchWork, index: int) -> None:
        group = work.groups[index]
        keep = sorted(group.admitted)
        mine = [group.admitted[s] for s in keep]
        rows, needed = self.rules.rows, self.packer.rows_needed
        alone = needed(mine)
        if alone > rows:
            raise ValueError(
                f"rows: group of task {group.task.id!r} needs {alone} {self.packer.unit} on "
                f"its own, more than rows={rows}; size rows for the chains one group can make"
            )
        earlier = [s for g in work.groups if g.state == COMPLETE for s in g.admitted.values()]
        if needed(earlier + mine) > rows:
            group.state = CUT
            work.counts["cut"] += 1
            return
        group.state = COMPLETE
        group.order = work.completed
        work.completed += 1
        if self.rules.admit is not None and work.completed >= self.rules.admit:
            for other, g in enumerate(work.groups):
                if g.state == OPEN:
                    g.state = DROPPED
                    self._stop_group(work, other)


def dynamic_rules(dynamic_sampling: Any, admit: int | None) -> tuple[int | None, int]:
    """``(admit, max_draws)`` of a scheduler given ``dynamic_sampling`` (a
    ``dew.rollouts.dynamic_sampling.DynamicSampling`` or None): its ``groups`` become the
    batch's ``admit`` (the first groups with signal train), its ``max_draws`` the rounds."""
    if dynamic_sampling is None:
        return admit, 1
    if admit is not None:
        raise ValueError(
            f"admit: dynamic sampling admits its own {dynamic_sampling.groups} groups, "
            f"expected admit unset, got {admit!r}"
        )
    return int(dynamic_sampling.groups), int(dynamic_sampling.max_draws)


def sampling_metrics(work: BatchWork, rules: Rules) -> dict[str, float]:
    """Dynamic sampling's metrics for a collected batch (empty when it is off), named as
    the synchronous rollout names them: ``sampling/draws`` (rounds of the most drawn
    group), ``sampling/informative_share`` (rounds with signal among rounds drawn) and
    ``sampling/filled_groups`` (uniform groups trained at their last round)."""
    if rules.max_draws <= 1:
        return {}
    drawn = work.counts["drawn"]
    return {
        "sampling/draws": float(max((g.draws for g in work.groups), default=1)),
        "sampling/informative_share": (drawn - work.counts["uniform"]) / max(1, drawn),
        "sampling/filled_groups": float(work.counts["filled"]),
    }


def _score(session: Session, truncation: str) -> float:
    """The reward ``session`` trains on, as dynamic sampling compares them (none: 0)."""
    if session.reward is None or (session.status is Status.TRUNCATED and truncation == "zero"):
        return 0.0
    return float(session.reward)


__all__ = ["Admission", "Rules", "dynamic_rules", "sampling_metrics"]

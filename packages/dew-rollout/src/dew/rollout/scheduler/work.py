"""The rollouts of one batch in flight: its groups, each sample's attempts, and the futures
the source returned (host side)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from concurrent.futures import Future

import numpy as np

from dew.sessions.records import Session, Task

OPEN, COMPLETE, ABANDONED, CUT, DROPPED = "open", "complete", "abandoned", "cut", "dropped"


@dataclasses.dataclass(eq=False)
class Entry:
    """One submitted rollout: which sample of which group, its attempt, and when and under
    which served version it was submitted."""

    group: int
    sample: int
    attempt: int
    future: Future[Session]
    version: int
    started: float


@dataclasses.dataclass(eq=False)
class Group:
    """One task's samples: admitted sessions by sample index, failures per sample, state."""

    task: Task
    admitted: dict[int, Session] = dataclasses.field(default_factory=dict)
    latencies: dict[int, float] = dataclasses.field(default_factory=dict)
    failures: Counter[int] = dataclasses.field(default_factory=Counter)
    attempts: Counter[int] = dataclasses.field(default_factory=Counter)
    state: str = OPEN
    order: int = -1  # position among the batch's completed groups
    draws: int = 1  # rounds of samples drawn (dynamic sampling draws uniform groups again)


class BatchWork:
    """Every rollout of batch ``index``: ``samples`` per group (groups + oversample)."""

    def __init__(self, index: int, tasks: list[Task], samples: int, seed: int, process: int):
        self.index = index
        self.groups = [Group(task) for task in tasks]
        self.samples = samples
        self.seed = seed
        self.process = process
        self.entries: dict[int, Entry] = {}
        self.completed = 0
        self.counts: Counter[str] = Counter()

    def seed_of(self, group: int, sample: int, attempt: int) -> int:
        """The source seed of one attempt: fixed by the run seed, process, batch index,
        group, sample and attempt, so a resubmission after a crash draws the same ids."""
        words = [self.seed, self.process, self.index, group, sample, attempt]
        return int(np.random.SeedSequence(words).generate_state(1)[0])

    def add(self, entry: Entry) -> None:
        self.entries[id(entry.future)] = entry

    def pop(self, future: Future[Session]) -> Entry | None:
        return self.entries.pop(id(future), None)

    def running(self, group: int) -> list[Entry]:
        return [e for e in self.entries.values() if e.group == group]

    def futures(self) -> list[Future[Session]]:
        return [e.future for e in self.entries.values()]

    def open_groups(self) -> int:
        return sum(g.state == OPEN for g in self.groups)

    @staticmethod
    def now() -> float:
        return time.monotonic()


__all__ = ["ABANDONED", "COMPLETE", "CUT", "DROPPED", "OPEN", "BatchWork", "Entry", "Group"]

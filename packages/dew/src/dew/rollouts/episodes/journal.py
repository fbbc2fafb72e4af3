"""EpisodeJournal: a crash-safe record of episode collections in SQLite, one database per rank.

Layout (the conventions of ``dew.journal_files``): ``directory/rank-<index>.sqlite`` (WAL,
``synchronous=FULL``) and the writer lock ``rank-<index>.lock``, held while a journal is
open, so a second writer for the same rank is refused with :class:`JournalBusy`; closing
the journal (or the end of its process) lets the next one in.

Tables:

- ``collections``: one row per attempted step: the update clock, a JSON header (task ids,
  sampling controls, budgets, topology), the key data and the digest of the local policy
  shards;
- ``turns``: per (step, slot, turn) the action (context, tokens, both likelihoods, termination,
  policy step), its ``state`` (``pending`` before the environment runs it, ``completed`` with
  the observation and the environment's snapshot after);
- ``endings``: per (step, slot) the final status, detail and reward.

Every write is its own committed transaction, so a pending draw is on disk before the tool
runs and a completed turn before the next tool call or update.

Recovery (:meth:`EpisodeJournal.begin` for a step already recorded) compares the header, the
key and the policy digest with the new attempt: a different policy at the same clocks raises
:class:`PolicyMismatch`, any other difference :class:`JournalMismatch` naming the field.
Completed turns come back exactly (ids, likelihoods, observations, snapshots); a pending
draw is reused instead of sampled again (its tool call may then run a second time, so tools
must make external effects idempotent using the episode identity and the action).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from dew.journal_files import JournalBusy, WriterLock, lock, rank_file, rank_name
from dew.rollouts.episodes.protocol import Action, EpisodeStatus, Observation

_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    step INTEGER PRIMARY KEY, updates INTEGER NOT NULL, header TEXT NOT NULL,
    key TEXT NOT NULL, digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    step INTEGER NOT NULL, slot INTEGER NOT NULL, turn INTEGER NOT NULL,
    state TEXT NOT NULL, action TEXT NOT NULL, observation TEXT, snapshot BLOB,
    PRIMARY KEY (step, slot, turn));
CREATE TABLE IF NOT EXISTS endings (
    step INTEGER NOT NULL, slot INTEGER NOT NULL, status TEXT NOT NULL, detail TEXT NOT NULL,
    reward REAL, PRIMARY KEY (step, slot));
"""


class JournalMismatch(ValueError):
    """A recorded collection disagrees with the new attempt of the same step."""


class PolicyMismatch(JournalMismatch):
    """A different policy (digest of the local shards) at the same training clocks."""


def policy_digest(variables: Any) -> str:
    """SHA-256 over this process's shards of every leaf (each distinct shard once)."""
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(variables):
        if isinstance(leaf, jax.Array):
            seen = set()
            for shard in leaf.addressable_shards:
                index = repr(shard.index)
                if index in seen:
                    continue
                seen.add(index)
                data = np.asarray(shard.data)
                digest.update(f"{data.dtype}{data.shape}{index}".encode())
                digest.update(np.ascontiguousarray(data).tobytes())
        else:
            data = np.asarray(leaf)
            digest.update(f"{data.dtype}{data.shape}".encode())
            digest.update(np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()


def attempt_header(tasks: Any, sampling: dict[str, Any], budgets: list[int]) -> dict[str, Any]:
    """What a recovery compares besides clocks, key and policy: task ids, sampling controls,
    budgets and the topology of this process."""
    return {
        "tasks": [int(t) for t in tasks],
        "sampling": json.loads(json.dumps(sampling)),
        "budgets": [int(b) for b in budgets],
        "topology": {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(),
            "devices": jax.device_count(),
        },
    }


def _action_json(action: Action) -> str:
    return json.dumps(
        {
            "context": np.asarray(action.context).tolist(),
            "tokens": np.asarray(action.tokens).tolist(),
            "raw": np.asarray(action.raw_log_probs, np.float64).tolist(),
            "behavior": np.asarray(action.behavior_log_probs, np.float64).tolist(),
            "terminated": bool(action.terminated),
            "policy_step": int(action.policy_step),
        }
    )


def _action(text: str) -> Action:
    data = json.loads(text)
    return Action(
        context=data["context"],
        tokens=data["tokens"],
        raw_log_probs=data["raw"],
        behavior_log_probs=data["behavior"],
        terminated=data["terminated"],
        policy_step=data["policy_step"],
    )


def _observation_json(observation: Observation) -> str:
    context = None if observation.context is None else np.asarray(observation.context).tolist()
    return json.dumps(
        {"context": context, "status": observation.status.value, "detail": observation.detail}
    )


def _observation(text: str) -> Observation:
    data = json.loads(text)
    return Observation(data["context"], EpisodeStatus(data["status"]), data["detail"])


@dataclass
class SlotRecord:
    """What the journal holds for one slot of a recovered collection."""

    first: Observation | None = None
    completed: list[tuple[Action, Observation, bytes | None]] = field(default_factory=list)
    pending: Action | None = None
    ending: tuple[EpisodeStatus, str, float | None] | None = None


class EpisodeJournal:
    """Pending and completed turns of episode collections, one SQLite WAL per rank.

    Args:
      directory: the run's journal directory (one per run); created if missing.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self._db: sqlite3.Connection | None = None
        self._lock: WriterLock | None = None
        self.rank: int | None = None
        self.step: int | None = None
        self._mutex = threading.Lock()  # environments step on several threads

    # ------------------------------------------------------------------ files
    def open(self, rank: int) -> None:
        """Open (or create) this rank's database and take its writer lock."""
        if self._db is not None:
            if rank != self.rank:
                raise JournalMismatch(f"rank: the journal is open for {self.rank}, got {rank}")
            return
        writer = lock(self.directory, rank_name(rank, "lock"), f"the journal of rank {rank}")
        try:
            path = rank_file(self.directory, rank, "sqlite")
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
        except BaseException:
            writer.release()
            raise
        self._db, self._lock, self.rank = db, writer, rank

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()
        writer, self._lock = self._lock, None
        if writer is not None:
            writer.release()

    def __enter__(self) -> EpisodeJournal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        assert self._db is not None, "EpisodeJournal: open() before writing"
        with self._mutex, self._db:  # one committed transaction per write
            self._db.execute(sql, args)

    # ------------------------------------------------------------------ collections
    def begin(
        self, step: int, updates: int, header: dict[str, Any], key: str, digest: str
    ) -> dict[int, SlotRecord]:
        """Start (or resume) the collection of ``step``; returns the recorded slots."""
        assert self._db is not None, "EpisodeJournal: open() before begin()"
        row = self._db.execute(
            "SELECT updates, header, key, digest FROM collections WHERE step = ?", (step,)
        ).fetchone()
        self.step = step
        text = json.dumps(header, sort_keys=True)
        if row is None:
            self._write(
                "INSERT INTO collections VALUES (?, ?, ?, ?, ?)", (step, updates, text, key, digest)
            )
            return {}
        recorded_updates, recorded_header, recorded_key, recorded_digest = row
        if recorded_updates != updates:
            raise JournalMismatch(
                f"updates: step {step} was recorded after {recorded_updates} committed updates, "
                f"this attempt comes after {updates}"
            )
        old = json.loads(recorded_header)
        for name in sorted(set(old) | set(header)):
            if old.get(name) != json.loads(json.dumps(header.get(name))):
                raise JournalMismatch(
                    f"{name}: step {step} was recorded with {old.get(name)!r}, this attempt has "
                    f"{header.get(name)!r}"
                )
        if recorded_key != key:
            raise JournalMismatch(
                f"key: step {step} was recorded with key {recorded_key}, this attempt has {key}"
            )
        if recorded_digest != digest:
            raise PolicyMismatch(
                f"policy: step {step} after {updates} updates was recorded with policy digest "
                f"{recorded_digest[:16]}, this attempt binds {digest[:16]}; a different policy "
                "at the same clocks"
            )
        return self._slots(step)

    def _slots(self, step: int) -> dict[int, SlotRecord]:
        assert self._db is not None
        slots: dict[int, SlotRecord] = {}
        for slot, _, state, action, observation, snapshot in self._db.execute(
            "SELECT slot, turn, state, action, observation, snapshot FROM turns "
            "WHERE step = ? ORDER BY slot, turn",
            (step,),
        ):
            record = slots.setdefault(slot, SlotRecord())
            if state == "first":
                record.first = _observation(observation)
            elif state == "completed":
                record.completed.append(
                    (
                        _action(action),
                        _observation(observation),
                        None if snapshot is None else bytes(snapshot),
                    )
                )
            else:
                record.pending = _action(action)
        for slot, status, detail, reward in self._db.execute(
            "SELECT slot, status, detail, reward FROM endings WHERE step = ?", (step,)
        ):
            slots.setdefault(slot, SlotRecord()).ending = (EpisodeStatus(status), detail, reward)
        return slots

    def opened(self, slot: int, first: Observation) -> None:
        """Commit the observation an environment's reset answered."""
        self._write(
            "INSERT OR REPLACE INTO turns VALUES (?, ?, -1, 'first', '', ?, NULL)",
            (self.step, slot, _observation_json(first)),
        )

    def pending(self, slot: int, turn: int, action: Action) -> None:
        """Save a sampled action before the environment runs it."""
        self._write(
            "INSERT OR REPLACE INTO turns VALUES (?, ?, ?, 'pending', ?, NULL, NULL)",
            (self.step, slot, turn, _action_json(action)),
        )

    def completed(
        self, slot: int, turn: int, action: Action, observation: Observation, snapshot: bytes | None
    ) -> None:
        """Commit a finished turn with the environment's snapshot after it."""
        self._write(
            "INSERT OR REPLACE INTO turns VALUES (?, ?, ?, 'completed', ?, ?, ?)",
            (self.step, slot, turn, _action_json(action), _observation_json(observation), snapshot),
        )

    def ended(self, slot: int, status: EpisodeStatus, detail: str, reward: float | None) -> None:
        """Commit how an episode ended and its reward."""
        self._write(
            "INSERT OR REPLACE INTO endings VALUES (?, ?, ?, ?, ?)",
            (self.step, slot, status.value, detail, reward),
        )


__all__ = [
    "EpisodeJournal",
    "JournalBusy",
    "JournalMismatch",
    "PolicyMismatch",
    "SlotRecord",
    "policy_digest",
]

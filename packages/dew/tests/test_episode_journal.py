"""EpisodeJournal in one process: what is committed, recovery after an aborted collection
(completed turns replayed, the pending draw reused), and every refusal."""

from __future__ import annotations

import os
import sqlite3

import jax
import numpy as np
import pytest
from _square_episodes import EOS, Log, ScriptedPolicy, SquareEnvironment, square_verifier

from dew.objectives.rl import (
    EpisodeFailure,
    EpisodeJournal,
    EpisodeRollout,
    JournalBusy,
    JournalMismatch,
    PolicyMismatch,
)
from dew.rollouts.episodes import EpisodeStatus
from dew.sampling import Sampling

P, R, K, G = 8, 4, 3, 2
SAMPLING = Sampling(eos_id=EOS)
VARIABLES = {"params": {"w": np.arange(4, dtype=np.float32)}}


class Snapshotting(SquareEnvironment):
    """The square tool with snapshots; fails the answer turn of one episode when told."""

    broken: set = set()

    def get_state(self) -> bytes:
        return bytes([self.calls])

    def set_state(self, state: bytes) -> None:
        self.log.events.append(("restore", self.id, state))
        self.calls = state[0]

    def step(self, action):
        if (self.id.task, self.id.sample) in self.broken and self.calls == 1:
            raise RuntimeError("the tool host went away")
        return super().step(action)


def rollout_for(directory, log, policy=None, sampling=SAMPLING, threads=16):
    return EpisodeRollout(
        policy or ScriptedPolicy(),
        lambda i: Snapshotting(i, log),
        square_verifier,
        P,
        R,
        K,
        G,
        sampling,
        journal=EpisodeJournal(directory),
        environment_threads=threads,
    )


def steps_of(log, kind="step"):
    return [ev for ev in log.events if ev[0] == kind]


def test_a_clean_collection_commits_every_turn(tmp_path):
    log = Log()
    rollout = rollout_for(tmp_path, log)
    rollout.at_step(1, 0)
    rollout(VARIABLES, {"task_id": np.array([3])}, jax.random.key(0))
    rollout.journal.close()
    db = sqlite3.connect(tmp_path / "rank-00000.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    states = db.execute("SELECT slot, turn, state FROM turns ORDER BY slot, turn").fetchall()
    assert states == [
        (s, t, k) for s in (0, 1) for t, k in ((-1, "first"), (0, "completed"), (1, "completed"))
    ]
    endings = db.execute("SELECT slot, status, reward FROM endings ORDER BY slot").fetchall()
    assert endings == [(0, "completed", 1.0), (1, "completed", 1.0)]


def test_recovery_replays_completed_turns_and_reuses_the_pending_draw(tmp_path):
    log = Log()
    Snapshotting.broken = {(3, 1)}
    rollout = rollout_for(tmp_path, log)
    rollout.at_step(4, 2)
    with pytest.raises(EpisodeFailure, match="the tool host went away"):
        rollout(VARIABLES, {"task_id": np.array([3])}, jax.random.key(0))
    rollout.journal.close()
    first_run_steps = len(steps_of(log))
    assert first_run_steps == 3  # both calls and slot 0's answer (slot 1's answer raised)

    # The same step again: a policy that would answer wrongly shows which draws are reused.
    Snapshotting.broken = set()
    log2 = Log()
    again = rollout_for(tmp_path, log2, ScriptedPolicy(answer_offset=5))
    again.at_step(4, 2)
    again(VARIABLES, {"task_id": np.array([3])}, jax.random.key(0))
    slot0, slot1 = again.last_episodes
    assert slot0.status is EpisodeStatus.COMPLETED and slot0.reward == 1.0
    # both answers were sent in the same round, so slot 0 was not scored when slot 1 failed:
    # its turns are replayed and its tool restored from the snapshot, never stepped again
    events = [ev[0] for ev in log2.events if ev[1] == slot0.id]
    assert events == ["enter", "reset", "restore", "exit"]
    # slot 1: the completed call is restored from its snapshot, the pending answer reused
    assert [ev[0] for ev in log2.events if ev[1] == slot1.id] == [
        "enter",
        "reset",
        "restore",
        "step",
        "exit",
    ]
    assert slot1.detail == "9" and slot1.reward == 1.0  # the reused draw, not the new policy's
    assert [a.tokens.tolist() for a in slot1.actions][0] == [2, EOS]


def test_recovery_refuses_a_different_attempt(tmp_path):
    log = Log()
    rollout = rollout_for(tmp_path, log)
    rollout.at_step(1, 0)
    rollout(VARIABLES, {"task_id": np.array([3])}, jax.random.key(0))
    rollout.journal.close()

    def attempt(variables=VARIABLES, tasks=(3,), key=0, updates=0, sampling=SAMPLING):
        other = rollout_for(tmp_path, Log(), sampling=sampling)
        other.at_step(1, updates)
        try:
            other(variables, {"task_id": np.array(tasks)}, jax.random.key(key))
        finally:
            other.journal.close()

    with pytest.raises(JournalMismatch, match=r"tasks: step 1 was recorded with \[3\]"):
        attempt(tasks=(4,))
    with pytest.raises(JournalMismatch, match="key: step 1 was recorded with key"):
        attempt(key=1)
    with pytest.raises(JournalMismatch, match="updates: step 1 was recorded after 0"):
        attempt(updates=1)
    with pytest.raises(JournalMismatch, match="sampling: step 1 was recorded with"):
        attempt(sampling=Sampling(eos_id=EOS, temperature=0.5))
    changed = {"params": {"w": np.arange(4, dtype=np.float32) + 1}}
    with pytest.raises(PolicyMismatch, match="a different policy at the same clocks"):
        attempt(variables=changed)
    attempt()  # the same attempt recovers


def test_a_second_writer_is_refused(tmp_path):
    first = EpisodeJournal(tmp_path)
    first.open(0)
    try:
        with pytest.raises(JournalBusy, match="another writer holds the journal of rank 0") as no:
            EpisodeJournal(tmp_path).open(0)
        assert str(no.value).startswith(f"{tmp_path}: ")  # names the directory
        with EpisodeJournal(tmp_path) as other:
            other.open(1)  # another rank has its own database
    finally:
        first.close()
    names = {f"rank-0000{rank}.{suffix}" for rank in (0, 1) for suffix in ("lock", "sqlite")}
    assert names <= set(os.listdir(tmp_path))  # the layout of dew.journal_files
    with EpisodeJournal(tmp_path) as again:
        again.open(0)  # closing released the lock


def test_a_journal_needs_snapshots(tmp_path):
    log = Log()
    rollout = EpisodeRollout(
        ScriptedPolicy(),
        lambda i: SquareEnvironment(i, log),
        square_verifier,
        P,
        R,
        K,
        G,
        SAMPLING,
        journal=EpisodeJournal(tmp_path),
    )
    with pytest.raises(EpisodeFailure) as caught:
        rollout(VARIABLES, {"task_id": np.array([3])}, jax.random.key(0))
    assert "a journal needs get_state() and set_state()" in str(caught.value.__cause__)
    assert log.open == set()

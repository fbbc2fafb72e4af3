"""WeightJournal on its own: its files, the writer lock, and reopening after a close.

The scheduler's exact resume through the journal runs in
test_rollout_scheduler_processes.py (a worker killed mid-run and resumed).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dew.journal_files import JournalBusy
from dew.rollout import WeightJournal


def variables(scale: float) -> dict:
    return {"params": {"b": np.full(2, scale, np.float32), "w": np.arange(3.0) * scale}}


def test_the_files_and_a_reopen_after_close(tmp_path):
    directory = tmp_path / "journal"
    with WeightJournal(directory, keep=2) as journal:
        for version in (1, 2, 3):
            journal.pushed(variables(version), version)
        journal.submitted(7, 2)
        journal.submitted(8, 3)
        assert journal.version_of(7) == 2 and journal.version_of(9) is None
    assert sorted(os.listdir(directory)) == [
        "submitted.json",
        "weights-2.npz",
        "weights-3.npz",
        "weights.lock",
    ]
    assert json.loads((directory / "submitted.json").read_text()) == {"7": 2, "8": 3}
    with WeightJournal(directory, keep=2) as again:  # the close released the lock
        assert again.version_of(8) == 3
        kept = again.weights(2, variables(0))
        np.testing.assert_array_equal(kept["params"]["w"], np.arange(3.0) * 2)
        assert again.weights(1, variables(0)) is None  # older than the last two


def test_a_submitted_record_written_before_the_lock_existed_is_read(tmp_path):
    (tmp_path / "submitted.json").write_text('{"4": 1, "5": 1}')
    journal = WeightJournal(tmp_path, keep=3)
    try:
        assert journal.version_of(4) == 1 and journal.version_of(5) == 1
    finally:
        journal.close()


def test_a_second_writer_is_refused_and_a_closed_journal_writes_nothing(tmp_path):
    first = WeightJournal(tmp_path, keep=2)
    with pytest.raises(JournalBusy, match=f"{tmp_path}: another writer holds the weight journal"):
        WeightJournal(tmp_path, keep=2)
    first.close()
    first.close()  # twice does nothing
    with pytest.raises(RuntimeError, match="the weight journal is closed"):
        first.submitted(1, 1)
    with pytest.raises(RuntimeError, match="the weight journal is closed"):
        first.pushed(variables(1), 1)
    assert os.listdir(tmp_path) == ["weights.lock"]
    WeightJournal(tmp_path, keep=2).close()


def test_an_unreadable_record_is_reported_and_leaves_the_directory_unlocked(tmp_path):
    (tmp_path / "submitted.json").write_text("{not json")
    with pytest.raises(ValueError, match="submitted.json: not a JSON journal record"):
        WeightJournal(tmp_path, keep=2)
    (tmp_path / "submitted.json").unlink()
    WeightJournal(tmp_path, keep=2).close()  # the failed open released its lock

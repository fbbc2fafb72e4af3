"""``dew.journal_files``: rank file names, the one-writer lock, JSON sidecars."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dew.journal_files import JournalBusy, lock, rank_file, rank_name, read_json, write_json

#: Takes the lock of argv[1] named argv[2], says so on stdout, and sleeps.
HOLDER = """
import sys, time
from dew.journal_files import JournalBusy, lock
try:
    held = lock(sys.argv[1], sys.argv[2], "the test journal")
except JournalBusy as error:
    print("busy:", error, flush=True)
    sys.exit(5)
print("held", flush=True)
time.sleep(60)
"""


def holder(directory: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), name], stdout=subprocess.PIPE, text=True
    )


def test_rank_names_use_five_digits() -> None:
    assert rank_name(0, "lock") == "rank-00000.lock"
    assert rank_name(123, "sqlite") == "rank-00123.sqlite"
    assert rank_file("/runs/a/journal", 7, "sqlite") == "/runs/a/journal/rank-00007.sqlite"
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError, match="rank"):
            rank_name(bad, "lock")  # type: ignore[arg-type]


def test_a_second_writer_is_refused_naming_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "journal"  # created by the first writer
    first = lock(directory, "rank-00000.lock", "the journal of rank 0")
    assert first.held and (directory / "rank-00000.lock").is_file()
    with pytest.raises(JournalBusy) as caught:
        lock(directory, "rank-00000.lock", "the journal of rank 0")
    message = str(caught.value)
    assert message.startswith(f"{directory}: another writer holds the journal of rank 0")
    assert "rank-00000.lock" in message
    with lock(directory, "rank-00001.lock", "the journal of rank 1") as other:
        assert other.held  # another lock file of the same directory is free
    assert not other.held
    first.release()
    first.release()  # twice does nothing
    with lock(directory, "rank-00000.lock", "the journal of rank 0") as again:
        assert again.held


def test_a_forgotten_lock_is_released_when_collected(tmp_path: Path) -> None:
    lock(tmp_path, "w.lock", "the journal")  # dropped at once
    gc.collect()
    lock(tmp_path, "w.lock", "the journal").release()


def test_the_lock_keeps_out_other_processes_until_its_holder_dies(tmp_path: Path) -> None:
    with lock(tmp_path, "w.lock", "the test journal"):
        refused = holder(tmp_path, "w.lock")
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 5, out
        assert out.startswith(f"busy: {tmp_path}: another writer holds the test journal")
    owner = holder(tmp_path, "w.lock")
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == "held\n"
        with pytest.raises(JournalBusy):
            lock(tmp_path, "w.lock", "the test journal")
    finally:
        owner.send_signal(signal.SIGKILL)  # a crash: no release, the kernel drops the lock
        owner.wait(60)
        if owner.stdout is not None:
            owner.stdout.close()
    lock(tmp_path, "w.lock", "the test journal").release()


def test_json_sidecars_round_trip_and_a_missing_one_gives_the_default(tmp_path: Path) -> None:
    path = tmp_path / "submitted.json"
    assert read_json(path) is None
    assert read_json(path, {}) == {}
    write_json(path, {"3": 1, "4": 2})
    assert read_json(path, {}) == {"3": 1, "4": 2}
    write_json(path, {"5": 2})
    assert read_json(path) == {"5": 2}
    assert sorted(os.listdir(tmp_path)) == ["submitted.json"]  # no temporary file left


def test_a_sidecar_that_holds_no_json_raises_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "submitted.json"
    path.write_text('{"3": 1')
    with pytest.raises(ValueError, match=f"{path}: not a JSON journal record"):
        read_json(path, {})
    with pytest.raises(TypeError):
        write_json(path, {"3": object()})
    assert path.read_text() == '{"3": 1'  # a failed write leaves the old file whole

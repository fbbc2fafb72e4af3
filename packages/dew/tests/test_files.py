"""dew.files: atomic writes leave the old file or the whole new one, and no temporary files."""

from __future__ import annotations

import os
import stat

import pytest

from dew.files import atomic_path, atomic_write


def test_atomic_write_replaces_the_file_whole(tmp_path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    with atomic_write(target, "w") as f:
        f.write("new ü")
        assert target.read_text() == "old"  # nothing visible before the block ends
    assert target.read_text(encoding="utf-8") == "new ü"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path) -> None:
    target = tmp_path / "weights.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_write(target) as f:
            f.write(b"half")
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]


def test_the_new_file_gets_ordinary_permissions(tmp_path) -> None:
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.bin") as f:
            f.write(b"x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644


def test_atomic_path_hands_a_name_to_writers_that_want_one(tmp_path) -> None:
    target = tmp_path / "tokenizer.json"
    with atomic_path(target) as name:
        assert os.path.dirname(name) == str(tmp_path) and os.path.exists(name)
        with open(name, "w", encoding="utf-8") as f:
            f.write("{}")
        assert not target.exists()
    assert target.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]


def test_bad_modes_are_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="mode: expected 'w' or 'wb', got 'a'"):
        with atomic_write(tmp_path / "x", "a"):
            pass
    with pytest.raises(ValueError, match="encoding: only text mode 'w' takes one"):
        with atomic_write(tmp_path / "x", "wb", encoding="utf-8"):
            pass
    assert list(tmp_path.iterdir()) == []

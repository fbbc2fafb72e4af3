"""dew.files: atomic writes leave the old file or the whole new one, and no temporary files."""

from __future__ import annotations

import os
import stat

import pytest

from dew.files import atomic_path, atomic_write, write_bytes, write_json, write_text


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


def _record_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


@pytest.mark.parametrize(
    ("write", "value", "expected"),
    [
        (write_bytes, b"\x00\x01", b"\x00\x01"),
        (write_text, "tëxt", "tëxt".encode()),
        (write_json, {"b": 1, "a": [2]}, b'{"b": 1, "a": [2]}'),
    ],
)
def test_every_kind_of_write_is_fsynced(tmp_path, monkeypatch, write, value, expected) -> None:
    calls = _record_fsyncs(monkeypatch)
    write(tmp_path / "out", value)
    assert (tmp_path / "out").read_bytes() == expected
    assert calls, f"{write.__name__} wrote without fsync"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_context_managers_fsync_too(tmp_path, monkeypatch) -> None:
    calls = _record_fsyncs(monkeypatch)
    with atomic_write(tmp_path / "a", "w") as f:
        f.write("a")
    assert len(calls) == 1
    with atomic_path(tmp_path / "b") as name:
        with open(name, "wb") as f:
            f.write(b"b")
    assert len(calls) == 2


def test_write_json_takes_the_layout_of_json_dump(tmp_path) -> None:
    write_json(tmp_path / "a.json", {"b": 1, "a": 2}, indent=2, sort_keys=True, newline=True)
    assert (tmp_path / "a.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


class _Unencodable:
    pass


@pytest.mark.parametrize(
    ("write", "value"),
    [
        (write_json, {"ok": 1, "bad": _Unencodable()}),  # json.dump fails part-way through
        (write_text, "\udcff"),  # UTF-8 cannot encode a lone surrogate
        (write_bytes, "not bytes"),
    ],
)
def test_a_failure_while_writing_keeps_the_old_target_and_leaves_no_temporary(
    tmp_path, write, value
) -> None:
    target = tmp_path / "out"
    target.write_bytes(b"old")
    with pytest.raises((TypeError, UnicodeEncodeError)):
        write(target, value)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_fsync_keeps_the_old_target_and_leaves_no_temporary(tmp_path, monkeypatch):
    def fsync(fd: int) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "out"
    target.write_text("old")
    for write, value in ((write_bytes, b"new"), (write_text, "new"), (write_json, "new")):
        with pytest.raises(OSError, match="no space left"):
            write(target, value)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

"""Trackers and the progress bar: JSON lines, TensorBoard event files, TTY-only drawing."""

from __future__ import annotations

import io
import json
import struct

import pytest

from dew.trainer.progress import Progress
from dew.trainer.tensorboard import EventWriter, crc32c, masked_crc
from dew.trainer.tracker import JsonlTracker, TensorBoardTracker


def test_crc32c_known_vectors():
    # RFC 3720 (iSCSI) B.4 check values for CRC-32C
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(bytes([0xFF] * 32)) == 0x62A8AB43


def read_varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at


def decode(buf: bytes) -> dict[int, list]:
    """A minimal protobuf reader: field number -> list of raw values."""
    out: dict[int, list] = {}
    at = 0
    while at < len(buf):
        key, at = read_varint(buf, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = read_varint(buf, at)
        elif kind == 1:
            value, at = struct.unpack("<d", buf[at : at + 8])[0], at + 8
        elif kind == 5:
            value, at = struct.unpack("<f", buf[at : at + 4])[0], at + 4
        elif kind == 2:
            n, at = read_varint(buf, at)
            value, at = buf[at : at + n], at + n
        else:
            raise AssertionError(f"wire type {kind}")
        out.setdefault(number, []).append(value)
    return out


def records(path: str) -> list[bytes]:
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        header = data[at : at + 8]
        (n,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc(header)
        payload = data[at + 12 : at + 12 + n]
        assert struct.unpack("<I", data[at + 12 + n : at + 16 + n])[0] == masked_crc(payload)
        out.append(payload)
        at += 16 + n
    return out


def test_tensorboard_events_round_trip(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    tracker.write({"step": 7, "loss": 1.5, "val/perplexity": 4.25, "note": "text"})
    tracker.close()
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert name.startswith("events.out.tfevents.")
    first, second = records(str(tmp_path / name))
    assert decode(first)[3] == [b"brain.Event:2"]
    event = decode(second)
    assert event[2] == [7]
    values = [decode(v) for v in decode(event[5][0])[1]]
    assert {v[1][0].decode(): v[2][0] for v in values} == {"loss": 1.5, "val/perplexity": 4.25}
    assert isinstance(EventWriter, type)


def test_jsonl_tracker_appends(tmp_path):
    path = tmp_path / "m.jsonl"
    for step in (1, 2):
        t = JsonlTracker(path)
        t.write({"step": step, "loss": float("nan") if step == 2 else 0.5})
        t.close()
    rows = [json.loads(x) for x in open(path)]
    assert rows == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": "nan"}]


class FakeTTY(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_only_on_a_terminal(tty):
    stream = FakeTTY(tty)
    bar = Progress(10, stream=stream)
    bar.update(5, 0.25)
    bar.close()
    text = stream.getvalue()
    if tty:
        assert "5/10" in text and "loss 0.25" in text
    else:
        assert text == ""

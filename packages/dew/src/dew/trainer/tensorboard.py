"""A dependency-free TensorBoard scalar writer (event files in TFRecord framing).

TensorBoard reads ``events.out.tfevents.*`` files: a sequence of records, each
``len (uint64 LE) | masked crc32c(len) (uint32) | payload | masked crc32c(payload)``, whose
payload is a serialized ``tensorflow.Event`` protobuf. Only the few fields needed for scalars
are written, encoded by hand: ``Event.wall_time`` (1, double), ``Event.step`` (2, int64),
``Event.file_version`` (3, string, first record only) and ``Event.summary`` (5) holding
``Summary.Value`` entries (1) with ``tag`` (1, string) and ``simple_value`` (2, float).
Formats from tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto and
tensorflow/core/lib/io/record_writer.cc.
"""

from __future__ import annotations

import os
import socket
import struct
import time

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float, step: int, scalars: dict[str, float] | None = None, version: str | None = None
) -> bytes:
    """The ``Event`` protobuf bytes for a scalar summary (or the file-version header)."""
    out = _varint((1 << 3) | 1) + struct.pack("<d", wall_time)
    out += _varint(2 << 3) + _varint(int(step))
    if version is not None:
        out += _field_bytes(3, version.encode())
    if scalars:
        summary = b""
        for tag, value in scalars.items():
            entry = _field_bytes(1, tag.encode()) + _varint((2 << 3) | 5) + struct.pack("<f", value)
            summary += _field_bytes(1, entry)
        out += _field_bytes(5, summary)
    return out


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload and its masked CRC."""
    header = struct.pack("<Q", len(payload))
    return (
        header
        + struct.pack("<I", masked_crc(header))
        + payload
        + struct.pack("<I", masked_crc(payload))
    )


class EventWriter:
    """Appends scalar events to a new ``events.out.tfevents.<time>.<host>`` file in ``logdir``."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(os.fspath(logdir), name)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._file.write(frame(encode_event(time.time(), 0, version="brain.Event:2")))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._file.write(frame(encode_event(time.time(), step, values)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

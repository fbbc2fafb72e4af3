"""dew.png: the PNG bytes decode to the pixels drawn, and the file is written atomically."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from dew.png import Canvas, encode_png, write_png


def _decode(data: bytes) -> tuple[list[bytes], np.ndarray]:
    """The chunk kinds and the ``[H, W, 3]`` image of an 8-bit RGB PNG with filter 0 rows."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    kinds, pos, idat, header = [], 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        body = data[pos + 4 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(body)
        kind, payload = body[:4], body[4:]
        kinds.append(kind)
        if kind == b"IHDR":
            header = payload
        elif kind == b"IDAT":
            idat += payload
        pos += 12 + length
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", header)
    assert (depth, color) == (8, 2)
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter type 0 on every scanline
    return kinds, rows[:, 1:].reshape(height, width, 3)


def test_the_png_decodes_to_the_pixels_drawn() -> None:
    canvas = Canvas(7, 5, background=(10, 20, 30))
    canvas.rect(1, 1, 3, 4, (255, 0, 0))
    canvas.line(0, 4, 6, 4, (0, 255, 0))
    kinds, image = _decode(encode_png(canvas.pixels))
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]
    np.testing.assert_array_equal(image, canvas.pixels)
    assert tuple(image[2, 2]) == (255, 0, 0) and tuple(image[4, 6]) == (0, 255, 0)
    assert tuple(image[0, 0]) == (10, 20, 30)


def test_write_png_writes_the_encoded_bytes_and_no_temporary(tmp_path) -> None:
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    write_png(tmp_path / "grid.png", pixels)
    assert (tmp_path / "grid.png").read_bytes() == encode_png(pixels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]


def test_a_bad_image_is_refused_and_the_old_file_kept(tmp_path) -> None:
    target = tmp_path / "grid.png"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match=r"pixels: expected \[H, W, 3\] uint8"):
        write_png(target, np.zeros((2, 3), np.uint8))
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]

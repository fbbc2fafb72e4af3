"""A self-contained PNG writer and a tiny raster canvas (lines, rectangles, 3x5 text).

No plotting library is needed: ``Canvas`` holds an ``[H, W, 3]`` uint8 image, draws
anti-aliasing-free lines by sampling along the segment, filled rectangles and upper-case text
in a built-in 3x5 pixel font, and ``write_png`` encodes it as an 8-bit RGB PNG (one IHDR, one
zlib-compressed IDAT with filter type 0 on every scanline, IEND; each chunk's CRC-32 from
``zlib.crc32``), written atomically.

Any part of ``dew`` (and its satellites) may draw with it: it imports only ``numpy``, the
standard library and the leaf ``dew.files``.
"""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from dew.files import atomic_write

Color = tuple[int, int, int]

# 3x5 glyphs: five rows, each an octal digit whose three bits are the pixels, left first.
_FONT = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71717", "4": "55711",
    "5": "74717", "6": "74757", "7": "71111", "8": "75757", "9": "75717",
    "A": "25755", "B": "65656", "C": "74447", "D": "65556", "E": "74647",
    "F": "74644", "G": "74557", "H": "55755", "I": "72227", "J": "11157",
    "K": "55655", "L": "44447", "M": "57755", "N": "65555", "O": "75557",
    "P": "75744", "Q": "75573", "R": "65655", "S": "74717", "T": "72222",
    "U": "55557", "V": "55552", "W": "55775", "X": "55255", "Y": "55222",
    "Z": "71247", ".": "00002", "-": "00700", ":": "02020", "/": "11244",
    "%": "51245", "(": "24442", ")": "21112", "_": "00007", "+": "02720",
    "=": "07070", " ": "00000",
}  # fmt: skip


def _glyph(char: str) -> np.ndarray:
    """``[5, 3]`` bool bitmap of ``char`` (unknown characters draw as a blank)."""
    rows = _FONT.get(char, "00000")
    return np.array([[(int(r, 8) >> (2 - c)) & 1 for c in range(3)] for r in rows], bool)


class Canvas:
    """An RGB image to draw on; ``pixels`` is ``[height, width, 3]`` uint8."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        if width < 1 or height < 1:
            raise ValueError(f"Canvas: width and height must be >= 1, got {width}x{height}")
        self.width = width
        self.height = height
        self.pixels = np.empty((height, width, 3), np.uint8)
        self.pixels[:] = background

    def point(self, x: int, y: int, color: Color, size: int = 1) -> None:
        """A ``size`` x ``size`` square centred on ``(x, y)``, clipped to the canvas."""
        half = size // 2
        x0, x1 = max(x - half, 0), min(x - half + size, self.width)
        y0, y1 = max(y - half, 0), min(y - half + size, self.height)
        if x0 < x1 and y0 < y1:
            self.pixels[y0:y1, x0:x1] = color

    def line(
        self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 1
    ) -> None:
        """A straight segment, sampled at least once per pixel along its longer axis."""
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for t in np.linspace(0.0, 1.0, n + 1):
            self.point(int(round(x0 + (x1 - x0) * t)), int(round(y0 + (y1 - y0) * t)), color, width)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Filled rectangle over ``[x0, x1) x [y0, y1)``, clipped."""
        x0, x1 = max(min(x0, x1), 0), min(max(x0, x1), self.width)
        y0, y1 = max(min(y0, y1), 0), min(max(y0, y1), self.height)
        if x0 < x1 and y0 < y1:
            self.pixels[y0:y1, x0:x1] = color

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 1) -> None:
        """Upper-cased ``text`` in the 3x5 font, top-left at ``(x, y)``; 4 * scale per char."""
        for i, char in enumerate(text.upper()):
            bitmap = _glyph(char)
            for r, c in zip(*np.nonzero(bitmap), strict=True):
                left = x + (4 * i + int(c)) * scale
                top = y + int(r) * scale
                self.rect(left, top, left + scale, top + scale, color)


def encode_png(pixels: np.ndarray) -> bytes:
    """The PNG bytes of an ``[H, W, 3]`` uint8 image."""
    image = np.asarray(pixels)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"pixels: expected [H, W, 3] uint8, got {image.shape} {image.dtype}")
    height, width = image.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, -1)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


def write_png(path: str | os.PathLike[str], pixels: np.ndarray) -> None:
    """Encode ``pixels`` and write the PNG atomically (temporary file, then ``os.replace``)."""
    data = encode_png(pixels)
    with atomic_write(path, "wb") as f:
        f.write(data)

"""Coloured shapes drawn in code, and a colour reward: the data of the Flow-GRPO example.

Each image is ``[16, 16, 3]`` ``uint8``: one filled shape on a dark background. The condition
``label`` in ``[0, 6)`` fixes the shape (square, disk, triangle) and its size (small, large) as
``label = 2 * shape + size``; the colour (red, green or blue) and a small offset are drawn at
random, so a model trained by flow matching paints each shape in each colour about a third of
the time. :func:`colour_fraction` rewards the share of pixels in a target colour.
"""

from __future__ import annotations

import numpy as np

SIZE = 16
LABELS = 6
COLOURS = {
    "red": (230, 40, 40),
    "green": (40, 200, 40),
    "blue": (40, 80, 240),
}
BACKGROUND = (16, 16, 16)


def _mask(shape: int, large: bool, dy: int, dx: int) -> np.ndarray:
    """``[16, 16]`` bool pixels of one shape centred at ``(8 + dy, 8 + dx)``."""
    r = 5.5 if large else 3.5
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5
    cy, cx = SIZE / 2 + dy, SIZE / 2 + dx
    if shape == 0:  # square
        return (np.abs(y - cy) <= r * 0.85) & (np.abs(x - cx) <= r * 0.85)
    if shape == 1:  # disk
        return (y - cy) ** 2 + (x - cx) ** 2 <= r * r
    # triangle pointing up
    top, bottom = cy - r, cy + r
    inside = (y >= top) & (y <= bottom)
    half = (y - top) / (2 * r) * r
    return inside & (np.abs(x - cx) <= half)


def make_shapes(labels: np.ndarray, seed: int) -> np.ndarray:
    """``[N, 16, 16, 3]`` ``uint8`` images for ``labels`` ``[N]``, colours drawn from ``seed``."""
    labels = np.asarray(labels, np.int64).reshape(-1)
    if labels.size and (labels.min() < 0 or labels.max() >= LABELS):
        raise ValueError(
            f"labels: expected values in [0, {LABELS}), got {labels.min()}..{labels.max()}"
        )
    rng = np.random.default_rng(seed)
    palette = np.array(list(COLOURS.values()), np.uint8)
    out = np.empty((labels.size, SIZE, SIZE, 3), np.uint8)
    out[:] = np.array(BACKGROUND, np.uint8)
    for i, label in enumerate(labels):
        shape, large = divmod(int(label), 2)
        dy, dx = rng.integers(-2, 3, size=2)
        out[i][_mask(shape, bool(large), int(dy), int(dx))] = palette[rng.integers(len(palette))]
    return out


def colour_fraction(images: np.ndarray, colour: str = "red", tolerance: float = 0.5) -> np.ndarray:
    """``[N]`` float64 share of pixels within ``tolerance`` of ``colour`` in every channel.

    ``images`` are ``[N, H, W, 3]`` in ``[-1, 1]`` (what a ``FlowRollout`` reward receives).
    """
    if colour not in COLOURS:
        raise ValueError(f"colour: expected one of {sorted(COLOURS)}, got {colour!r}")
    target = np.array(COLOURS[colour], np.float64) / 127.5 - 1.0
    x = np.asarray(images, np.float64)
    close = np.all(np.abs(x - target) <= tolerance, axis=-1)
    return close.reshape(close.shape[0], -1).mean(axis=1)


def grid(rows: list[np.ndarray], pad: int = 2, scale: int = 3) -> np.ndarray:
    """``[H, W, 3]`` ``uint8`` picture of image rows (each ``[N, h, w, 3]`` in ``[-1, 1]``)."""
    lines = []
    for images in rows:
        pixels = np.clip((np.asarray(images, np.float64) + 1.0) * 127.5, 0, 255).astype(np.uint8)
        pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
        n, h, w, _ = pixels.shape
        line = np.full((h + pad, n * (w + pad) + pad, 3), 255, np.uint8)
        for i in range(n):
            line[pad:, pad + i * (w + pad) : pad + i * (w + pad) + w] = pixels[i]
        lines.append(line)
    width = max(line.shape[1] for line in lines)
    picture = np.full((sum(line.shape[0] for line in lines) + pad, width, 3), 255, np.uint8)
    y = 0
    for line in lines:
        picture[y : y + line.shape[0], : line.shape[1]] = line
        y += line.shape[0]
    return picture


__all__ = ["COLOURS", "LABELS", "SIZE", "colour_fraction", "grid", "make_shapes"]

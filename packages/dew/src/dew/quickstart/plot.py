"""The run's plot: loss, reward and held-out accuracy over the steps of every stage.

Stages are laid end to end on one step axis (stage ``k`` starts where stage ``k - 1`` ended),
so the three panels share it. Each panel draws its series in the colour of the stage they
belong to, grey boundaries between stages with the stage names above, and its value range on
the left. Accuracy is measured at stage boundaries only, so its panel joins those points.
Rendered with :mod:`dew.quickstart.png`; no plotting library is needed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from dew.quickstart.png import Canvas, Color, write_png

STAGE_COLORS: tuple[Color, ...] = (
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (148, 103, 189),
    (255, 127, 14),
)
GRID: Color = (200, 200, 200)
INK: Color = (40, 40, 40)


@dataclasses.dataclass(frozen=True)
class StageSeries:
    """One stage's points: ``(step within the stage, value)`` per metric.

    ``accuracy`` holds ``(0, before)`` and ``(steps, after)``; ``reward`` may be empty
    (stages without a reward).
    """

    name: str
    steps: int
    loss: tuple[tuple[int, float], ...]
    reward: tuple[tuple[int, float], ...]
    accuracy: tuple[tuple[int, float], ...]


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in points if math.isfinite(y)]


def _label(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 1000:
        return f"{value:.3g}"
    return f"{value:.1e}".replace("+", "")


def _range(values: Sequence[float], unit: bool) -> tuple[float, float]:
    """``(low, high)`` of ``values`` (``(0, 1)`` when ``unit``), widened when flat or empty."""
    if unit or not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    if high - low < 1e-9:
        return low - 0.5, high + 0.5
    return low, high


def render(stages: Sequence[StageSeries], width: int = 760, height: int = 560) -> Canvas:
    """Draw the three panels for ``stages`` and return the canvas."""
    canvas = Canvas(width, height)
    offsets = []
    total = 0
    for stage in stages:
        offsets.append(total)
        total += max(stage.steps, 1)
    total = max(total, 1)
    left, right, top_margin = 70, width - 20, 34
    panels = ("loss", "reward", "accuracy")
    panel_height = (height - top_margin - 20) // len(panels)
    canvas.text(left, 8, "DEW QUICKSTART", INK, scale=2)

    def x_of(step: float) -> float:
        return left + (right - left) * step / total

    for row, metric in enumerate(panels):
        top = top_margin + row * panel_height + 12
        bottom = top + panel_height - 28
        series = []
        for k, stage in enumerate(stages):
            points = _finite([(offsets[k] + s, v) for s, v in getattr(stage, metric)])
            series.append(points)
        values = [y for points in series for _, y in points]
        shared = _range([y for points in series for _, y in points], metric == "accuracy")
        # Losses of different objectives live on different scales: each stage gets its own.
        ranges = [
            _range([y for _, y in points], False) if metric == "loss" else shared
            for points in series
        ]

        def y_of(
            value: float,
            k: int,
            top: int = top,
            bottom: int = bottom,
            ranges: list[tuple[float, float]] = ranges,
        ) -> float:
            low, high = ranges[k]
            return bottom - (bottom - top) * (value - low) / (high - low)

        canvas.line(left, top, left, bottom, INK)
        canvas.line(left, bottom, right, bottom, INK)
        canvas.text(4, top - 2, metric, INK, scale=2)
        if metric == "loss":
            canvas.text(4, top + 14, "PER STAGE", INK)
            for k, points in enumerate(series):
                if points:
                    label_x = int(x_of(offsets[k])) + 3
                    canvas.text(label_x, top + 2, _label(ranges[k][1]), INK)
                    canvas.text(label_x, bottom - 7, _label(ranges[k][0]), INK)
        else:
            canvas.text(4, top + 14, _label(shared[1]), INK)
            canvas.text(4, bottom - 5, _label(shared[0]), INK)
        canvas.text(left, bottom + 4, "0", INK)
        canvas.text(right - 4 * len(str(total)), bottom + 4, str(total), INK)
        for k, stage in enumerate(stages):
            x = x_of(offsets[k])
            if k:
                for y in range(top, bottom, 6):
                    canvas.line(x, y, x, min(y + 2, bottom), GRID)
            if row == 0:
                canvas.text(int(x) + 3, top - 10, stage.name, STAGE_COLORS[k % len(STAGE_COLORS)])
        if not values:
            canvas.text((left + right) // 2 - 20, (top + bottom) // 2, "NO DATA", GRID)
        for k, points in enumerate(series):
            color = STAGE_COLORS[k % len(STAGE_COLORS)]
            for (x0, y0), (x1, y1) in zip(points, points[1:]):
                canvas.line(x_of(x0), y_of(y0, k), x_of(x1), y_of(y1, k), color, width=2)
            for px, py in points:
                size = 5 if metric == "accuracy" or len(points) == 1 else 1
                canvas.point(int(round(x_of(px))), int(round(y_of(py, k))), color, size)
    return canvas


def write_plot(path: str | os.PathLike[str], stages: Sequence[StageSeries]) -> None:
    """Render ``stages`` and write the PNG to ``path`` atomically."""
    write_png(path, render(stages).pixels)

"""The run's figure, ``plot.png``: one panel per quantity, drawn with matplotlib.

Panels, left to right and top to bottom:

1. held-out accuracy before training and after each stage, with standard-error bars;
2. SFT training loss per step;
3. DPO training loss per step;
4. the share of DPO pairs whose right id the policy ranks above its own wrong one, before and
   after DPO;
5. mean reward of the sampled GRPO completions per step (one line per rollout stage, so the
   ``--code`` stage adds a second);
6. wall-clock seconds each stage took.

Drawn on a ``Figure`` with the Agg canvas directly, so no global pyplot state or display is
touched. Every number comes from the stage results and their ``metrics.jsonl`` series.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from dew.files import atomic_path


@dataclasses.dataclass(frozen=True)
class StageSeries:
    """One stage's points for the figure.

    name, steps: the stage. loss, reward: ``(step, value)`` from its metrics (reward empty for
    stages without one). accuracy, standard_error: held-out accuracy ``(before, after)`` and
    their standard errors. preference: DPO's ``(before, after)`` share of pairs ranked right,
    None for other stages. seconds: the stage's wall-clock time.
    """

    name: str
    steps: int
    loss: tuple[tuple[int, float], ...]
    reward: tuple[tuple[int, float], ...]
    accuracy: tuple[float, float]
    standard_error: tuple[float, float]
    preference: tuple[float, float] | None
    seconds: float


def _finite(points: Sequence[tuple[int, float]]) -> tuple[list[int], list[float]]:
    kept = [(x, y) for x, y in points if math.isfinite(y)]
    return [x for x, _ in kept], [y for _, y in kept]


def write_plot(path: str, stages: Sequence[StageSeries], title: str = "dew quickstart") -> None:
    """Draw the figure for ``stages`` (in training order) and write it to ``path`` atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not stages:
        raise ValueError("stages: expected at least one stage to plot, got none")
    figure = Figure(figsize=(15, 8.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3)
    figure.suptitle(title)
    colors = [f"C{k}" for k in range(len(stages))]

    ax = axes[0, 0]
    labels = ["start"] + [f"after {s.name}" for s in stages]
    values = [stages[0].accuracy[0]] + [s.accuracy[1] for s in stages]
    errors = [stages[0].standard_error[0]] + [s.standard_error[1] for s in stages]
    ax.errorbar(range(len(values)), values, yerr=errors, color="k", marker="o", capsize=4,
                label="accuracy ± standard error")  # fmt: skip
    for k, value in enumerate(values):
        ax.annotate(f"{value:.3f}", (k, value), textcoords="offset points", xytext=(6, -12))
    ax.set_xticks(range(len(values)), labels)
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("Held-out accuracy")
    ax.legend(loc="lower right")

    for ax, kind in ((axes[0, 1], "sft"), (axes[0, 2], "dpo")):
        for stage, color in zip(stages, colors, strict=True):
            if stage.name == kind:
                xs, ys = _finite(stage.loss)
                ax.plot(xs, ys, color=color, label=f"{kind} loss")
        ax.set_xlabel(f"{kind.upper()} step")
        ax.set_ylabel("training loss")
        ax.set_title(f"{kind.upper()} loss")
        if ax.lines:
            ax.legend(loc="upper right")

    ax = axes[1, 0]
    dpo = [s for s in stages if s.preference is not None]
    if dpo:
        before, after = dpo[0].preference  # type: ignore[misc]
        bars = ax.bar(["before DPO", "after DPO"], [before, after], color=["C7", colors[1]],
                      label="pairs ranked right")  # fmt: skip
        ax.bar_label(bars, fmt="%.2f")
        ax.legend(loc="upper left")
    ax.set_ylim(0.0, 1.05)
    ax.set_ylabel("share of DPO pairs")
    ax.set_title("DPO pairs: right id ranked above the policy's wrong one")

    ax = axes[1, 1]
    for stage, color in zip(stages, colors, strict=True):
        if stage.reward:
            xs, ys = _finite(stage.reward)
            ax.plot(xs, ys, color=color, marker=".", label=f"{stage.name} mean reward")
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("rollout stage step")
    ax.set_ylabel("mean reward of sampled answers")
    ax.set_title("GRPO reward during training")
    if ax.lines:
        ax.legend(loc="lower right")

    ax = axes[1, 2]
    bars = ax.bar([s.name for s in stages], [s.seconds for s in stages], color=colors,
                  label="wall-clock seconds")  # fmt: skip
    ax.bar_label(bars, fmt="%.0f")
    ax.set_xlabel("stage")
    ax.set_ylabel("seconds")
    ax.set_title("Time per stage")
    ax.legend(loc="upper right")

    with atomic_path(path) as temp:
        figure.savefig(temp, format="png")

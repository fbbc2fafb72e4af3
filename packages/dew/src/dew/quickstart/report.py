"""Run-directory bookkeeping: atomic JSON files, stage metrics, the summary table and plot."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from dew.files import atomic_write
from dew.quickstart.plot import StageSeries, write_plot


def write_json(path: str, value: Any) -> None:
    """Write ``value`` as JSON atomically (temporary file in the same folder, ``os.replace``)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with atomic_write(path, "w") as f:
        json.dump(value, f, indent=1)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (an absent file has none); a resumed stage may have
    logged a step twice, the later record wins."""
    if not os.path.isfile(path):
        return []
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                by_step[int(record["step"])] = record
    return [by_step[k] for k in sorted(by_step)]


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def stage_series(run_dir: str, stages: Sequence[dict[str, Any]]) -> list[StageSeries]:
    """Plot series of every stage from its ``metrics.jsonl`` and its accuracies."""
    out = []
    for stage in stages:
        records = read_metrics(os.path.join(run_dir, stage["name"], "metrics.jsonl"))
        loss = tuple((int(r["step"]), _number(r["loss"])) for r in records if "loss" in r)
        reward = tuple(
            (int(r["step"]), _number(r["reward/mean"])) for r in records if "reward/mean" in r
        )
        accuracy = ((0, stage["accuracy_before"]), (stage["steps"], stage["accuracy_after"]))
        out.append(StageSeries(stage["name"], stage["steps"], loss, reward, accuracy))
    return out


def write_report_plot(run_dir: str, stages: Sequence[dict[str, Any]]) -> str:
    path = os.path.join(run_dir, "plot.png")
    write_plot(path, stage_series(run_dir, stages))
    return path


def table(stages: Sequence[dict[str, Any]]) -> str:
    """The held-out accuracy table printed at the end of a run."""
    lines = [
        f"{'stage':<6} {'steps':>6} {'accuracy before':>16} {'accuracy after':>15} {'seconds':>8}",
    ]
    for s in stages:
        lines.append(
            f"{s['name']:<6} {s['steps']:>6} {s['accuracy_before']:>16.3f} "
            f"{s['accuracy_after']:>15.3f} {s['seconds']:>8.1f}"
        )
    return "\n".join(lines)

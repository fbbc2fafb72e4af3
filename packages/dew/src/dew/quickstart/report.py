"""Run-directory bookkeeping: atomic JSON files, stage metrics, the summary table and plot."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from dew import files
from dew.quickstart.plot import StageSeries, write_plot


def write_json(path: str, value: Any) -> None:
    """Write ``value`` as JSON atomically (temporary file in the same folder, ``os.replace``)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    files.write_json(path, value, indent=1)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (an absent file has none); a resumed stage may have
    logged a step twice, the later record wins, and a line a kill cut short is passed over."""
    if not os.path.isfile(path):
        return []
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill; the resumed stage logs that step again
            by_step[int(record["step"])] = record
    return [by_step[k] for k in sorted(by_step)]


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def reward_curve(run_dir: str, name: str) -> list[tuple[int, float]]:
    """``(step, mean reward)`` of a rollout stage from its ``metrics.jsonl`` (empty if none)."""
    records = read_metrics(os.path.join(run_dir, name, "metrics.jsonl"))
    return [(int(r["step"]), _number(r["reward/mean"])) for r in records if "reward/mean" in r]


def stage_series(run_dir: str, stages: Sequence[dict[str, Any]]) -> list[StageSeries]:
    """Plot series of every stage from its ``metrics.jsonl`` and its result."""
    out = []
    for stage in stages:
        records = read_metrics(os.path.join(run_dir, stage["name"], "metrics.jsonl"))
        loss = tuple((int(r["step"]), _number(r["loss"])) for r in records if "loss" in r)
        preference = None
        if "preference_accuracy_before" in stage:
            preference = (stage["preference_accuracy_before"], stage["preference_accuracy_after"])
        out.append(
            StageSeries(
                name=stage["name"],
                steps=stage["steps"],
                loss=loss,
                reward=tuple(reward_curve(run_dir, stage["name"])),
                accuracy=(stage["accuracy_before"], stage["accuracy_after"]),
                standard_error=(stage["standard_error_before"], stage["standard_error_after"]),
                preference=preference,
                seconds=stage["seconds"],
            )
        )
    return out


def write_report_plot(run_dir: str, stages: Sequence[dict[str, Any]]) -> str:
    path = os.path.join(run_dir, "plot.png")
    write_plot(path, stage_series(run_dir, stages))
    return path


def table(stages: Sequence[dict[str, Any]]) -> str:
    """The held-out accuracy table: each stage's accuracy before and after, +- its standard
    error, and its seconds."""
    lines = [
        f"{'stage':<6} {'steps':>6} {'accuracy before':>16} {'accuracy after':>16} {'seconds':>8}",
    ]
    for s in stages:
        before = f"{s['accuracy_before']:.3f} ± {s['standard_error_before']:.3f}"
        after = f"{s['accuracy_after']:.3f} ± {s['standard_error_after']:.3f}"
        lines.append(
            f"{s['name']:<6} {s['steps']:>6} {before:>16} {after:>16} {s['seconds']:>8.1f}"
        )
    return "\n".join(lines)


def report(stages: Sequence[dict[str, Any]], curves: dict[str, Any] | None = None) -> str:
    """What a run prints at the end: the table, DPO's pairs ranked right before and after,
    the reward of each rollout stage at its first and last logged step, and a few held-out
    problems each stage changed."""
    lines = [table(stages), ""]
    for s in stages:
        if "preference_accuracy_before" in s:
            lines.append(
                f"{s['name']}: {s['pairs']} on-policy pairs; the policy ranks the right id above "
                f"its own wrong one in {s['preference_accuracy_before']:.2f} of them before and "
                f"{s['preference_accuracy_after']:.2f} after"
            )
        curve = (curves or {}).get(s["name"])
        if curve:
            points = "  ".join(
                f"{step}:{value:.2f}" for step, value in curve[:: max(1, len(curve) // 8)]
            )
            lines.append(
                f"{s['name']}: mean sampled reward by step  {points}  (last {curve[-1][1]:.2f})"
            )
    for s in stages:
        for example in s.get("changed", [])[:3]:
            mark = "fixed" if example["correct_after"] else "broken"
            lines.append(
                f"{s['name']} {mark}: {example['question']}\n    before: {example['before']}\n"
                f"    after:  {example['after']}"
            )
    return "\n".join(lines)

"""The Flow-GRPO example end to end: learn coloured shapes, then learn to paint them red.

1. ``DiffusionObjective`` trains a small ``SimpleDiT`` on ``[16, 16, 3]`` shapes drawn in code
   (``dew.flow.shapes``), conditioned on a label that fixes shape and size; colours are random.
2. The reward, the share of red pixels (``colour_fraction``), is measured on held-out labels
   (never used by the RL stage) and on the RL labels, with fixed sampling keys.
3. ``FlowGRPOObjective`` with a ``FlowRollout`` raises that reward on the RL labels (a small
   KL term to the pretrained policy keeps the shapes while they turn red).
4. The same measurement again, with the same keys, so each sample's change is paired; the
   mean change and its standard error, ``summary.json``, ``report.md`` and ``grid.png``
   (held-out samples before, top rows, and after, bottom rows) go into the run directory.

``run(run_dir, settings)`` does it; ``main(argv)`` is the command line of
``dew quickstart --flow`` (found through the ``dew.quickstart`` entry point ``flow``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset
from dew.files import write_json, write_text
from dew.flow import shapes
from dew.flow.grpo import FlowGRPOObjective
from dew.flow.inputs import Field, InputSpec
from dew.flow.models import LabelEncoder, SimpleDiT
from dew.flow.objective import DiffusionObjective
from dew.flow.presets import Flow
from dew.flow.rollout import FlowRollout
from dew.png import write_png

RL_LABELS = (0, 1, 2, 3)  # squares and disks
HELD_OUT = (4, 5)  # triangles: measured, never rolled out
GRID = "grid.png"
GRID_COLUMNS = 8
GRID_LAYOUT = (
    "held-out samples, one row per label and the same starting noise in each column: the top "
    "rows before Flow-GRPO, the bottom rows after"
)
REPORT = "report.md"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and step counts of one run (``short()`` is the test's version).

    ``pretrain_lr`` is the peak of a cosine decay to 5 % over ``pretrain_steps``;
    ``noise_level`` is the SDE's ``a`` during rollouts, ``clip`` both clip ranges of the
    ratio, ``beta`` the weight of the KL to the pretrained policy.
    """

    seed: int = 0
    emb_features: int = 64
    num_layers: int = 1
    num_heads: int = 4
    pretrain_steps: int = 1200
    pretrain_batch: int = 24
    pretrain_lr: float = 5e-3
    rl_steps: int = 24
    rl_rows: int = 8
    groups: int = 8
    steps: int = 6
    train_steps: int | None = None
    noise_level: float = 0.7
    clip: float = 0.2
    beta: float = 0.1
    rl_lr: float = 1e-3
    eval_samples: int = 48
    colour: str = "red"

    @classmethod
    def short(cls, seed: int = 0) -> Settings:
        """A cut-down run for tests: shorter stages, fewer samples, no KL term."""
        return cls(seed=seed, pretrain_steps=500, rl_steps=16, beta=0.0, eval_samples=32)

    def scaled(self, factor: float) -> Settings:
        """Both stages' step counts times ``factor`` (at least one step each)."""
        return dataclasses.replace(
            self,
            pretrain_steps=max(1, round(self.pretrain_steps * factor)),
            rl_steps=max(1, round(self.rl_steps * factor)),
        )


def _pretrain_batches(settings: Settings) -> Any:
    def train(partition: Any, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        rows = settings.pretrain_batch // partition.count
        for i in itertools.count(start):
            rng = np.random.default_rng([settings.seed, i, partition.index])
            labels = rng.integers(0, shapes.LABELS, rows).astype(np.int32)
            seed = int(rng.integers(1 << 31))
            yield {"image": shapes.make_shapes(labels, seed), "label": labels}

    return train


def _rl_batches(settings: Settings) -> Any:
    def train(partition: Any, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        rows = settings.rl_rows // partition.count
        for i in itertools.count(start):
            rng = np.random.default_rng([settings.seed, 10_000 + i, partition.index])
            yield {"label": rng.choice(RL_LABELS, rows).astype(np.int32)}

    return train


def rewards(
    objective: Any,
    variables: Any,
    labels: Sequence[int],
    settings: Settings,
    generate: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Colour reward of ``eval_samples`` ODE samples per label (fixed keys), and the images.

    Returns ``([len(labels) * eval_samples] rewards, [same, 16, 16, 3] images)``, label by
    label. The keys depend only on the seed and the label, so two calls with different
    ``variables`` score the same starting noises: their differences are paired.
    generate: a jitted ``objective.generate`` (``steps`` static) shared between calls, so
    it compiles once; None jits one for this call."""
    scores, images = [], []
    if generate is None:
        generate = jax.jit(objective.generate, static_argnames=("steps",))
    for label in labels:
        batch = {"label": np.full((settings.eval_samples,), label, np.int32)}
        key = jax.random.key(settings.seed * 1000 + 17 + label)
        out = np.asarray(generate(variables, batch, key, steps=settings.steps))
        scores.append(shapes.colour_fraction(out, settings.colour))
        images.append(out)
    return np.concatenate(scores), np.concatenate(images)


def mean_reward(
    objective: Any,
    variables: Any,
    labels: Sequence[int],
    settings: Settings,
    generate: Any = None,
) -> tuple[float, np.ndarray]:
    """Mean of :func:`rewards`, and the images."""
    scores, images = rewards(objective, variables, labels, settings, generate)
    return float(np.mean(scores)), images


def paired_change(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """``(mean of after - before, its standard error)`` over paired samples (ddof 1)."""
    diff = np.asarray(after, np.float64) - np.asarray(before, np.float64)
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(diff.size))


def _parts(settings: Settings) -> tuple[Any, Any, InputSpec, dict[str, Any]]:
    """The DiT, its process, the input spec and the label encoder of a run."""
    inputs = InputSpec(Field("image", (shapes.SIZE, shapes.SIZE, 3)), Field("label", (), "int32"))
    model = SimpleDiT(output_channels=3, patch_size=4, emb_features=settings.emb_features,
                      num_layers=settings.num_layers, num_heads=settings.num_heads, mlp_ratio=2)  # fmt: skip
    encoders = {"label": LabelEncoder(shapes.LABELS, settings.emb_features)}
    return model, Flow(noise_level=settings.noise_level)(), inputs, encoders


def _pretrain(run_dir: str, settings: Settings, progress: bool | None) -> Any:
    """Flow matching from a fresh initialisation; returns the variables (on the host)."""
    model, process, inputs, encoders = _parts(settings)
    objective = DiffusionObjective(model, process, inputs, encoders=encoders)
    data = Dataset(train=_pretrain_batches(settings), val=None, records=None,
                   batch=settings.pretrain_batch)  # fmt: skip
    lr = optax.cosine_decay_schedule(settings.pretrain_lr, settings.pretrain_steps, alpha=0.05)
    print(f"[flow] flow matching: {settings.pretrain_steps} steps", flush=True)
    trainer = Trainer(objective, optax.adam(lr), key=jax.random.key(settings.seed),
                      progress=progress)  # fmt: skip
    state = trainer.fit(data, settings.pretrain_steps, log_every=50,
                        run_dir=os.path.join(run_dir, "pretrain"))  # fmt: skip
    return jax.device_get(state.params)


def _flow_grpo_objective(settings: Settings, pretrained: Any) -> FlowGRPOObjective:
    model, process, inputs, encoders = _parts(settings)
    return FlowGRPOObjective(model, process, inputs, guidance=None, beta=settings.beta,
                             steps=settings.steps, encoders=encoders, pretrained=pretrained,
                             epsilon_low=settings.clip, epsilon_high=settings.clip)  # fmt: skip


def _flow_grpo(
    run_dir: str, settings: Settings, objective: FlowGRPOObjective, progress: bool | None
) -> tuple[Any, int]:
    """Flow-GRPO on the RL labels; returns the final variables and the update count."""

    def reward(images: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        return shapes.colour_fraction(images, settings.colour)

    rollout = FlowRollout(objective, reward, groups=settings.groups, steps=settings.steps,
                          train_steps=settings.train_steps)  # fmt: skip
    data = Dataset(train=_rl_batches(settings), val=None, records=None, batch=settings.rl_rows)
    print(f"[flow] Flow-GRPO: {settings.rl_steps} updates", flush=True)
    key = jax.random.fold_in(jax.random.key(settings.seed), 1)
    trainer = Trainer(objective, optax.adam(settings.rl_lr), key=key, rollout=rollout,
                      progress=progress)  # fmt: skip
    state = trainer.fit(data, settings.rl_steps, log_every=1,
                        run_dir=os.path.join(run_dir, "flow_grpo"))  # fmt: skip
    return jax.device_get(state.params), int(jax.device_get(state.updates))


def _measure(objective: Any, variables: Any, settings: Settings, generate: Any, when: str) -> Any:
    """Held-out and RL-label rewards (per sample) and the held-out images; prints the means."""
    held, images = rewards(objective, variables, HELD_OUT, settings, generate)
    trained, _ = rewards(objective, variables, RL_LABELS, settings, generate)
    print(f"[flow] mean {settings.colour} share {when} Flow-GRPO:{' ' * (when == 'after')} "
          f"held-out {held.mean():.3f}, RL labels {trained.mean():.3f}", flush=True)  # fmt: skip
    return held, trained, images


def _grid_rows(before: np.ndarray, after: np.ndarray, settings: Settings) -> list[np.ndarray]:
    """The first ``GRID_COLUMNS`` samples of each held-out label, before then after."""
    shown, n = min(GRID_COLUMNS, settings.eval_samples), settings.eval_samples
    rows = [before[i * n : i * n + shown] for i in range(len(HELD_OUT))]
    return rows + [after[i * n : i * n + shown] for i in range(len(HELD_OUT))]


def run(run_dir: str, settings: Settings, progress: bool | None = None) -> dict[str, Any]:
    """Train both stages in ``run_dir``; return (and write) the summary."""
    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    pretrained = _pretrain(run_dir, settings, progress)
    pretrain_seconds = time.perf_counter() - t0
    objective = _flow_grpo_objective(settings, pretrained)
    sample = jax.jit(objective.generate, static_argnames=("steps",))  # one compile for all four
    held_before, rl_before, images_before = _measure(objective, pretrained, settings, sample,
                                                     "before")  # fmt: skip
    start = time.perf_counter()
    final, updates = _flow_grpo(run_dir, settings, objective, progress)
    rl_seconds = time.perf_counter() - start
    held_after, rl_after, images_after = _measure(objective, final, settings, sample, "after")
    write_png(os.path.join(run_dir, GRID), shapes.grid(_grid_rows(images_before, images_after,
                                                                  settings)))  # fmt: skip
    held_change, held_se = paired_change(held_before, held_after)
    rl_change, rl_se = paired_change(rl_before, rl_after)
    summary = {
        "complete": True,
        "settings": dataclasses.asdict(settings),
        "reward": settings.colour,
        "held_out_labels": list(HELD_OUT),
        "rl_labels": list(RL_LABELS),
        "held_out_reward_before": float(held_before.mean()),
        "held_out_reward_after": float(held_after.mean()),
        "held_out_change": held_change,
        "held_out_change_se": held_se,
        "rl_reward_before": float(rl_before.mean()),
        "rl_reward_after": float(rl_after.mean()),
        "rl_change": rl_change,
        "rl_change_se": rl_se,
        "samples_per_label": settings.eval_samples,
        "updates": updates,
        "pretrain_seconds": round(pretrain_seconds, 2),
        "flow_grpo_seconds": round(rl_seconds, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "grid": GRID,
        "grid_layout": GRID_LAYOUT,
        "report": REPORT,
    }
    _write_summary(run_dir, summary)
    return summary


def _write_summary(run_dir: str, summary: dict[str, Any]) -> None:
    """``summary.json`` and ``report.md`` (the numbers, and the grid shown inline)."""
    write_json(os.path.join(run_dir, "summary.json"), summary, indent=2, sort_keys=True,
               newline=True)  # fmt: skip
    write_text(os.path.join(run_dir, REPORT), report_markdown(summary))
    print(f"[flow] held-out {summary['reward']} share change "
          f"{summary['held_out_change']:+.3f} (standard error {summary['held_out_change_se']:.3f}"
          f"); report: {os.path.join(run_dir, REPORT)}", flush=True)  # fmt: skip


def report_markdown(summary: dict[str, Any]) -> str:
    """The markdown report of a finished run's ``summary``."""
    colour, n = summary["reward"], summary["samples_per_label"]
    lines = [
        f"# Flow-GRPO quickstart: {colour} share",
        "",
        f"Mean share of {colour} pixels in {n} ODE samples per label (the same starting noises "
        "before and after); the change is the mean of the paired differences, with its "
        "standard error.",
        "",
        "| labels | before | after | change | standard error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, key, labels in (("held-out", "held_out", "held_out_labels"),
                              ("RL", "rl", "rl_labels")):  # fmt: skip
        lines.append(
            f"| {name} {summary[labels]} | {summary[f'{key}_reward_before']:.3f} | "
            f"{summary[f'{key}_reward_after']:.3f} | {summary[f'{key}_change']:+.3f} | "
            f"{summary[f'{key}_change_se']:.4f} |"
        )
    lines += [
        "",
        f"{summary['updates']} Flow-GRPO updates; flow matching took "
        f"{summary['pretrain_seconds']:.0f} s, Flow-GRPO {summary['flow_grpo_seconds']:.0f} s, "
        f"the whole run {summary['seconds']:.0f} s.",
        "",
        f"![held-out samples]({summary['grid']})",
        "",
        f"{summary['grid_layout']}.",
        "",
    ]
    return "\n".join(lines)


def quickstart(
    run_dir: str, seed: int = 0, steps: float = 1.0, progress: bool | None = None
) -> int:
    """What ``dew quickstart --flow`` runs (the ``flow`` entry point of ``dew.quickstart``).

    A ``run_dir`` whose ``summary.json`` is complete for the same settings is only reported.
    Returns the exit status.
    """
    settings = Settings(seed=seed).scaled(steps)
    path = os.path.join(run_dir, "summary.json")
    if os.path.isfile(path):
        with open(path) as f:
            done = json.load(f)
        if done.get("complete") and done.get("settings") == dataclasses.asdict(settings):
            print(f"dew quickstart --flow: {run_dir} is complete; nothing to train.")
            print(
                f"held-out {settings.colour} share {done['held_out_reward_before']:.3f} -> "
                f"{done['held_out_reward_after']:.3f}; grid: {os.path.join(run_dir, done['grid'])}"
            )
            return 0
    run(run_dir, settings, progress)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", default="dew-flow-quickstart", help="where outputs go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=float, default=1.0, help="scale both stages' step counts")
    parser.add_argument("--short", action="store_true", help="the cut-down test settings")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of the example; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    settings = Settings.short(args.seed) if args.short else Settings(seed=args.seed)
    run(os.path.abspath(args.run_dir), settings.scaled(args.steps))
    return 0


__all__ = [
    "GRID",
    "HELD_OUT",
    "REPORT",
    "RL_LABELS",
    "Settings",
    "main",
    "mean_reward",
    "paired_change",
    "quickstart",
    "report_markdown",
    "rewards",
    "run",
]

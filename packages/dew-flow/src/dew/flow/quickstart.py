"""The Flow-GRPO example end to end: learn coloured shapes, then learn to paint them red.

1. ``DiffusionObjective`` trains a small ``SimpleDiT`` on ``[16, 16, 3]`` shapes drawn in code
   (``dew.flow.shapes``), conditioned on a label that fixes shape and size; colours are random.
2. The mean reward, the share of red pixels (``colour_fraction``), is measured on held-out
   labels (never used by the RL stage) and on the RL labels, with fixed sampling keys.
3. ``FlowGRPOObjective`` with a ``FlowRollout`` raises that reward on the RL labels.
4. The same measurement again; a PNG grid of held-out samples before (top rows) and after
   (bottom rows), and ``summary.json``, are written into the run directory.

``run(run_dir, settings)`` does it; ``main(argv)`` is the command line of
``dew quickstart --flow`` (found through the ``dew.quickstart`` entry point ``flow``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset
from dew.files import write_json
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


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and step counts of one run (``short()`` is the test's version)."""

    seed: int = 0
    emb_features: int = 48
    num_layers: int = 2
    num_heads: int = 4
    pretrain_steps: int = 600
    pretrain_batch: int = 32
    pretrain_lr: float = 2e-3
    rl_steps: int = 24
    rl_rows: int = 4
    groups: int = 8
    steps: int = 8
    train_steps: int | None = None
    rl_lr: float = 3e-4
    eval_samples: int = 48
    colour: str = "red"

    @classmethod
    def short(cls, seed: int = 0) -> Settings:
        """A cut-down run for tests."""
        return cls(
            seed=seed,
            emb_features=32,
            num_layers=1,
            pretrain_steps=250,
            pretrain_batch=24,
            rl_steps=8,
            rl_rows=4,
            groups=6,
            steps=6,
            rl_lr=1e-3,
            eval_samples=24,
        )

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


def mean_reward(
    objective: Any,
    variables: Any,
    labels: Sequence[int],
    settings: Settings,
    generate: Any = None,
) -> tuple[float, np.ndarray]:
    """Mean colour reward of ``eval_samples`` ODE samples per label (fixed keys), and images.

    generate: a jitted ``objective.generate`` (``steps`` static) shared between calls, so
    it compiles once; None jits one for this call."""
    rewards, images = [], []
    if generate is None:
        generate = jax.jit(objective.generate, static_argnames=("steps",))
    for label in labels:
        batch = {"label": np.full((settings.eval_samples,), label, np.int32)}
        key = jax.random.key(settings.seed * 1000 + 17 + label)
        out = np.asarray(generate(variables, batch, key, steps=settings.steps))
        rewards.append(shapes.colour_fraction(out, settings.colour))
        images.append(out)
    return float(np.mean(np.concatenate(rewards))), np.concatenate(images)


def run(run_dir: str, settings: Settings, progress: bool | None = None) -> dict[str, Any]:
    """Train both stages in ``run_dir``; return (and write) the summary."""
    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    inputs = InputSpec(Field("image", (shapes.SIZE, shapes.SIZE, 3)), Field("label", (), "int32"))
    model = SimpleDiT(output_channels=3, patch_size=4, emb_features=settings.emb_features,
                      num_layers=settings.num_layers, num_heads=settings.num_heads, mlp_ratio=2)  # fmt: skip
    encoders = {"label": LabelEncoder(shapes.LABELS, settings.emb_features)}
    process = Flow()()
    key = jax.random.key(settings.seed)

    pretrain = DiffusionObjective(model, process, inputs, encoders=encoders)
    data = Dataset(train=_pretrain_batches(settings), val=None, records=None,
                   batch=settings.pretrain_batch)  # fmt: skip
    print(f"[flow] flow matching: {settings.pretrain_steps} steps", flush=True)
    start = time.perf_counter()
    state = Trainer(pretrain, optax.adam(settings.pretrain_lr), key=key, progress=progress).fit(
        data, settings.pretrain_steps, log_every=50, run_dir=os.path.join(run_dir, "pretrain")
    )
    pretrain_seconds = time.perf_counter() - start
    pretrained = jax.device_get(state.params)

    objective = FlowGRPOObjective(model, process, inputs, guidance=None, beta=0.0,
                                  steps=settings.steps, encoders=encoders, pretrained=pretrained)  # fmt: skip
    sample = jax.jit(objective.generate, static_argnames=("steps",))  # one compile for all four
    held_before, held_images_before = mean_reward(objective, pretrained, HELD_OUT, settings, sample)
    rl_before, _ = mean_reward(objective, pretrained, RL_LABELS, settings, sample)
    print(f"[flow] mean {settings.colour} share before Flow-GRPO: held-out {held_before:.3f}, "
          f"RL labels {rl_before:.3f}", flush=True)  # fmt: skip

    def reward(images: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        return shapes.colour_fraction(images, settings.colour)

    rollout = FlowRollout(objective, reward, groups=settings.groups, steps=settings.steps,
                          train_steps=settings.train_steps)  # fmt: skip
    rl_data = Dataset(train=_rl_batches(settings), val=None, records=None, batch=settings.rl_rows)
    print(f"[flow] Flow-GRPO: {settings.rl_steps} updates", flush=True)
    start = time.perf_counter()
    rl_state = Trainer(objective, optax.adam(settings.rl_lr), key=jax.random.fold_in(key, 1),
                       rollout=rollout, progress=progress).fit(
        rl_data, settings.rl_steps, log_every=1, run_dir=os.path.join(run_dir, "flow_grpo")
    )  # fmt: skip
    rl_seconds = time.perf_counter() - start
    final = jax.device_get(rl_state.params)
    held_after, held_images_after = mean_reward(objective, final, HELD_OUT, settings, sample)
    rl_after, _ = mean_reward(objective, final, RL_LABELS, settings, sample)
    print(f"[flow] mean {settings.colour} share after Flow-GRPO:  held-out {held_after:.3f}, "
          f"RL labels {rl_after:.3f}", flush=True)  # fmt: skip

    shown = min(8, settings.eval_samples)
    picks = [i * settings.eval_samples + j for i in range(len(HELD_OUT)) for j in range(shown)]
    rows = [held_images_before[picks[k : k + shown]] for k in range(0, len(picks), shown)]
    rows += [held_images_after[picks[k : k + shown]] for k in range(0, len(picks), shown)]
    grid_path = os.path.join(run_dir, "grid.png")
    write_png(grid_path, shapes.grid(rows))
    summary = {
        "complete": True,
        "settings": dataclasses.asdict(settings),
        "reward": settings.colour,
        "held_out_labels": list(HELD_OUT),
        "rl_labels": list(RL_LABELS),
        "held_out_reward_before": held_before,
        "held_out_reward_after": held_after,
        "rl_reward_before": rl_before,
        "rl_reward_after": rl_after,
        "updates": int(jax.device_get(rl_state.updates)),
        "pretrain_seconds": round(pretrain_seconds, 2),
        "flow_grpo_seconds": round(rl_seconds, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "grid": os.path.basename(grid_path),
        "grid_layout": "held-out samples: top rows before Flow-GRPO, bottom rows after",
    }
    write_json(
        os.path.join(run_dir, "summary.json"), summary, indent=2, sort_keys=True, newline=True
    )
    print(f"[flow] summary: {os.path.join(run_dir, 'summary.json')}  grid: {grid_path}", flush=True)
    return summary


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


__all__ = ["HELD_OUT", "RL_LABELS", "Settings", "main", "mean_reward", "quickstart", "run"]

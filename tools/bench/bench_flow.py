"""One Flow-GRPO update of dew.flow (sampling, rewards, update) against the same step in PyTorch.

Dew's step is ``Trainer.fit`` with ``FlowGRPOObjective`` and ``FlowRollout`` on the example's
DiT (``dew.flow.quickstart``: 16x16x3 images, patch 4, ``--emb`` features, ``--layers``
blocks, label-conditioned), ``--rows`` source rows times ``--groups`` samples, ``--steps``
time points, every stochastic transition trained, AdamW after global-norm clipping at 1. The
rollout's own timings give sampling and rewards (rewards include building the batch); the
update runs from the end of the rollout until the new weights are ready.

The contender is ``tools/bench/torch_flow_step.py`` in the reference venv: the same model in
torch and the step as Flow-GRPO's ``scripts/train_sd3.py`` runs it (released
``sde_step_with_logprob``, one forward and backward per timestep, one optimizer step).

Rounds interleave the two (tools/bench/_rounds.py: dew ``--per-round`` steps, then torch's,
the order rotating), after one warm-up step each (dew compiles there), both pinned to the
same CPUs with the same thread count. Printed per phase and per contender: median and spread
(min-max) over the rounds, and the ratio torch / dew of the medians with the per-round
spread. A JSON record (CPU model, flags, cores, load average before and after, every time)
goes to tools/bench/results/flow.json. The machine is shared with other agents' jobs, so load
from them falls on both contenders alike but widens the spreads.

Usage: .venv/bin/python tools/bench/bench_flow.py [--rounds 3] [--per-round 3] [--cpus 0]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax
import numpy as np
import optax
from _rounds import Bench, Worker, add_arguments, reference_python  # noqa: E402

from dew import Trainer
from dew.data import Dataset
from dew.flow import shapes
from dew.flow.grpo import FlowGRPOObjective
from dew.flow.inputs import Field, InputSpec
from dew.flow.models import LabelEncoder, SimpleDiT
from dew.flow.presets import Flow
from dew.flow.rollout import FlowRollout

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("sampling", "rewards", "update", "total")


def torch_worker(config: dict[str, Any], tmp: str) -> Worker:
    """torch_flow_step.py in the reference venv, spoken to over JSON lines."""
    path = os.path.join(tmp, "config.json")
    Path(path).write_text(json.dumps(config))
    return Worker([reference_python(), str(Path(__file__).with_name("torch_flow_step.py")), path])


def torch_steps(worker: Worker, count: int) -> dict[str, list[float]]:
    got = worker.ask(time=count)
    out = {"sampling": got["sampling_s"], "rewards": got["rewards_s"], "update": got["update_s"]}
    out["total"] = [sum(x) for x in zip(*out.values())]
    return out


class DewStep:
    """Trainer.fit over the rollout, timed per step."""

    def __init__(self, args: argparse.Namespace) -> None:
        inputs = InputSpec(Field("image", (16, 16, 3)), Field("label", (), "int32"))
        model = SimpleDiT(output_channels=3, patch_size=4, emb_features=args.emb,
                          num_layers=args.layers, num_heads=4, mlp_ratio=2)  # fmt: skip
        encoders = {"label": LabelEncoder(shapes.LABELS, args.emb)}
        self.objective = FlowGRPOObjective(model, Flow()(), inputs, steps=args.steps,
                                           encoders=encoders)  # fmt: skip

        def reward(images: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
            return shapes.colour_fraction(images, "red")

        self.rollout = FlowRollout(self.objective, reward, groups=args.groups, steps=args.steps)
        batch = {"label": (np.arange(args.rows) % shapes.LABELS).astype(np.int32)}
        self.data = Dataset(train=lambda p: itertools.repeat(batch), records=None, batch=args.rows)
        optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.0))
        self.trainer = Trainer(self.objective, optimizer, key=jax.random.key(0),
                               rollout=self._timed, progress=False)  # fmt: skip
        self.state = self.trainer.initial_state()
        self.marks: list[tuple[float, float, dict[str, float]]] = []

    def _timed(self, variables: Any, local: Any, key: jax.Array) -> Any:
        jax.block_until_ready(variables)  # the previous update ends here, not inside sampling
        start = time.perf_counter()
        out = self.rollout(variables, local, key)
        self.marks.append((start, time.perf_counter(), dict(self.rollout.last_timings)))
        return out

    def steps(self, count: int) -> list[dict[str, float]]:
        self.marks.clear()
        target = int(jax.device_get(self.state.step)) + count
        self.state = self.trainer.fit(self.data, steps=target, state=self.state)
        jax.block_until_ready(self.state.params)
        end = time.perf_counter()
        out = []
        for i, (_start, done, t) in enumerate(self.marks):
            nxt = self.marks[i + 1][0] if i + 1 < len(self.marks) else end
            out.append({"sampling": t["sampling"], "rewards": t["rewards"] + t["batch"],
                        "update": nxt - done})  # fmt: skip
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--emb", type=int, default=48)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    bench = Bench("flow", args.cpus, args.threads)
    config = {"emb_features": args.emb, "num_layers": args.layers, "num_heads": 4,
              "mlp_ratio": 2, "patch_size": 4, "channels": 3, "size": 16,
              "labels": shapes.LABELS, "rows": args.rows, "groups": args.groups,
              "steps": args.steps, "lr": 1e-4, "threads": bench.threads}  # fmt: skip
    dew = DewStep(args)

    def dew_steps() -> dict[str, list[float]]:
        steps = dew.steps(args.per_round)
        out = {phase: [t[phase] for t in steps] for phase in ("sampling", "rewards", "update")}
        out["total"] = [sum(x) for x in zip(*out.values())]
        return out

    with tempfile.TemporaryDirectory() as tmp:
        worker = torch_worker(config, tmp)
        try:
            dew.steps(1)  # compile
            worker.ask(time=1)
            times = bench.rounds({"dew": dew_steps, "torch": lambda: torch_steps(worker,
                                  args.per_round)}, args.rounds)  # fmt: skip
        finally:
            worker.close()
    n = args.rows * args.groups
    bench.say(
        f"Flow-GRPO step: DiT emb {args.emb}, {args.layers} layers, 16x16x3, patch 4; {n} "
        f"samples ({args.rows} x {args.groups}), {args.steps} time points, all "
        f"{args.steps - 1} transitions trained; jax {jax.__version__}, torch "
        f"{worker.info['torch']} with {worker.info['threads']} threads; {args.rounds} rounds x "
        f"{args.per_round} steps, interleaved (a round's value: the median of its steps)"
    )
    for phase in PHASES:
        for name in ("dew", "torch"):
            bench.show(f"{name} {phase}", times[f"{name} {phase}"])
        bench.compare(f"{phase} torch / dew", times[f"torch {phase}"], times[f"dew {phase}"])
    bench.finish({"args": vars(args), "torch": worker.info})


if __name__ == "__main__":
    main()

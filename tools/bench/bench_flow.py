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

Rounds interleave the two (dew ``--per-round`` steps, then torch's), after one warm-up step
each (dew compiles there). Printed per phase and per contender: median and spread (min-max) of
the steps, and the ratio torch / dew of the medians; a ratio whose min-max ranges overlap is
reported as "not shown". A JSON record (CPU model, flags, cores, load average before and
after, every time) goes to ``--out``. The machine is shared with other agents' jobs, so load
from them falls on both contenders alike but widens the spreads.

Usage: .venv/bin/python tools/bench/bench_flow.py [--rounds 3] [--per-round 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class TorchWorker:
    """torch_flow_step.py in the reference venv, spoken to over JSON lines."""

    def __init__(self, config: dict[str, Any], tmp: str) -> None:
        python = subprocess.run(
            ["bash", str(ROOT / "tools" / "reference_env.sh")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()[-1]
        path = os.path.join(tmp, "config.json")
        Path(path).write_text(json.dumps(config))
        script = str(Path(__file__).with_name("torch_flow_step.py"))
        self.proc = subprocess.Popen(
            [python, script, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"torch worker exited with {self.proc.wait()}")
        return json.loads(line)

    def steps(self, count: int) -> list[dict[str, float]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"time": count}) + "\n")
        self.proc.stdin.flush()
        got = self._read()
        return [
            {"sampling": s, "rewards": r, "update": u}
            for s, r, u in zip(got["sampling_s"], got["rewards_s"], got["update_s"])
        ]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


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


def summarize(times: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for phase in PHASES:
        values = [t["sampling"] + t["rewards"] + t["update"] if phase == "total" else t[phase]
                  for t in times]  # fmt: skip
        out[phase] = {"median_s": statistics.median(values), "min_s": min(values),
                      "max_s": max(values)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--emb", type=int, default=48)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--out", default="bench_flow.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    config = {"emb_features": args.emb, "num_layers": args.layers, "num_heads": 4,
              "mlp_ratio": 2, "patch_size": 4, "channels": 3, "size": 16,
              "labels": shapes.LABELS, "rows": args.rows, "groups": args.groups,
              "steps": args.steps, "lr": 1e-4, "threads": args.torch_threads}  # fmt: skip
    dew = DewStep(args)
    with tempfile.TemporaryDirectory() as tmp:
        worker = TorchWorker(config, tmp)
        try:
            dew.steps(1)  # compile
            worker.steps(1)
            times: dict[str, list[dict[str, float]]] = {"dew": [], "torch": []}
            for _ in range(args.rounds):
                times["dew"] += dew.steps(args.per_round)
                times["torch"] += worker.steps(args.per_round)
        finally:
            worker.close()
    load_after = os.getloadavg()
    stats = {name: summarize(ts) for name, ts in times.items()}
    n = args.rows * args.groups
    print(
        f"Flow-GRPO step: DiT emb {args.emb}, {args.layers} layers, 16x16x3, patch 4; {n} "
        f"samples ({args.rows} x {args.groups}), {args.steps} time points, all "
        f"{args.steps - 1} transitions trained"
    )
    print(
        f"CPU {cpu_model()}, {os.cpu_count()} cores (shared with other agents' jobs); jax "
        f"{jax.__version__}, torch {worker.info['torch']} with {worker.info['threads']} threads; "
        f"{args.rounds} rounds x {args.per_round} steps, interleaved; load {load_before} -> "
        f"{load_after}"
    )
    ratios = {}
    for phase in PHASES:
        d, t = stats["dew"][phase], stats["torch"][phase]
        ratio = t["median_s"] / d["median_s"]
        overlap = not (t["min_s"] > d["max_s"] or d["min_s"] > t["max_s"])
        ratios[phase] = {"torch_over_dew": ratio, "shown": not overlap}
        print(
            f"  {phase:9s} dew {d['median_s'] * 1e3:8.1f} ms ({d['min_s'] * 1e3:.1f}-"
            f"{d['max_s'] * 1e3:.1f})  torch {t['median_s'] * 1e3:8.1f} ms "
            f"({t['min_s'] * 1e3:.1f}-{t['max_s'] * 1e3:.1f})  torch/dew "
            f"{ratio:5.2f}x{'' if not overlap else '  (spreads overlap: not shown)'}"
        )
    record = {
        "bench": "bench_flow",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "torch": worker.info,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "load_before": load_before,
        "load_after": load_after,
        "shared_machine": True,
        "args": vars(args),
        "stats": stats,
        "ratios": ratios,
        "times": times,
    }
    tmp_out = f"{args.out}.tmp"
    Path(tmp_out).write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp_out, args.out)
    print(f"record: {args.out}")


if __name__ == "__main__":
    main()

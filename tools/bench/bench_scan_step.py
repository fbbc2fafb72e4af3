"""A Trainer step with the decoder layers unrolled (the default) and scanned
(``DecoderConfig.scan_layers``, ``dew.models.scan``): does one compiled layer body looped
over cost step time?

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_scan_step.py [--rounds 5] [--steps 4] [--layers 4]

Both contenders are the library's compiled Trainer step (``LMObjective`` + AdamW, float32)
on the shape of ``bench_first_step.py`` (``qwen3``: width 256, ``--layers`` layers, 4 heads,
MLP 1024, vocabulary 4096; ``--batch`` rows of ``--seq-len`` tokens) from the same initial
parameters, in interleaved rounds (tools/bench/_rounds.py); a round's value is the median of
``--steps`` steps. Printed: the step time of each, median and spread; the ratio scan / loop
(below 1: scanning is faster); each one's first step in this process (compile and one
update). Record: tools/bench/results/scan_step.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments  # noqa: E402
from bench_lora import run_steps  # noqa: E402


def build_runs(args: argparse.Namespace) -> dict[str, dict]:
    """``{"loop" | "scan": {"step", "state", "batches", "i", "first_step_s"}}``."""
    import jax
    import numpy as np
    import optax

    from dew import models
    from dew.mesh import global_batch
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    shape = dict(vocab_size=4096, emb_features=256, num_layers=args.layers, num_heads=4,
                 mlp_features=1024, max_seq_len=args.seq_len)  # fmt: skip
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 4096, (args.batch, args.seq_len + 1)).astype(np.int32)
            for _ in range(4)]  # fmt: skip
    runs: dict[str, dict] = {}
    for name in ("loop", "scan"):
        model = models.build("qwen3", scan_layers=name == "scan", **shape)
        objective = LMObjective(model, args.seq_len, ema_decay=None)
        trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                          devices=jax.devices()[:1])  # fmt: skip
        state = trainer.initial_state()
        batches = [global_batch({"text": r}, trainer.mesh) for r in rows]
        step = trainer._step()
        start = time.perf_counter()
        state, metrics = step(state, batches[0])
        jax.block_until_ready(metrics)
        runs[name] = {"step": step, "state": state, "placed": batches, "i": 1,
                      "first_step_s": time.perf_counter() - start}  # fmt: skip
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per contender a round")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per row")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    args = parser.parse_args()
    bench = Bench("scan_step", cpus=args.cpus, threads=args.threads)
    runs = build_runs(args)

    def contender(name: str):  # type: ignore[no-untyped-def]
        return lambda: run_steps(runs[name], args.steps)

    times = bench.rounds({n: contender(n) for n in runs}, rounds=args.rounds)
    bench.say(f"Trainer step, qwen3 256x{args.layers}, batch {args.batch}, seq_len {args.seq_len}")
    for name in runs:
        extra = f"(first step in process {runs[name]['first_step_s']:.2f} s)"
        bench.show(f"{name} step", times[name], extra=extra)
    bench.compare("step: scan / loop", times["scan"], times["loop"])
    first = {name: run["first_step_s"] for name, run in runs.items()}
    bench.finish({"layers": args.layers, "seq_len": args.seq_len, "batch": args.batch,
                  "steps": args.steps, "first_step_s": first})  # fmt: skip


if __name__ == "__main__":
    main()

"""A training process for the multi-process and SIGKILL tests (run as a script).

usage: _train_worker.py OUT_NPZ STEPS [--run-dir DIR] [--checkpoint-every N]
                        [--process-id I --processes P --port PORT --devices D] [--sleep S] [--fsdp]

Trains a tiny decoder with LMObjective on deterministic batches (global batch 8, each process
reading its own rows) and writes the final train state leaves to OUT_NPZ from process 0.
Stopped by SIGINT/SIGTERM it prints ``interrupted STEP SIGNAL PROCESS`` and exits with 3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dew.testing.processes import join_cpu, process_arguments

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("steps", type=int)
    p.add_argument("--run-dir")
    p.add_argument("--checkpoint-every", type=int)
    process_arguments(p)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--fsdp", action="store_true")
    args = p.parse_args()

    join_cpu(args.devices, args.processes, args.process_id, args.port)
    import jax
    import numpy as np
    import optax

    from dew.data import Dataset
    from dew.objectives.lm import LMObjective
    from dew.testing import tiny_decoder
    from dew.trainer import Trainer, TrainingInterrupted

    seq, vocab, rows = 8, 32, 8

    def global_batch(i: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(1000 + i)
        text = rng.integers(1, vocab, size=(rows, seq + 1)).astype(np.int32)
        seg = np.ones((rows, seq + 1), np.int32)
        seg[:, rng.integers(3, seq) :] = 2
        seg[: rows // 2, -2:] = 0
        pos = np.zeros_like(seg)
        for r in range(rows):
            for s in (1, 2):
                pos[r, seg[r] == s] = np.arange(int((seg[r] == s).sum()))
        return {"text": text, "text_segment_ids": seg, "text_positions": pos}

    def train(partition, start=0):
        local = rows // partition.count
        i = start
        while True:
            b = global_batch(i)
            if args.sleep:
                time.sleep(args.sleep)
            yield {
                k: v[partition.index * local : (partition.index + 1) * local] for k, v in b.items()
            }
            i += 1

    model = tiny_decoder(vocab, seq + 1)
    objective = LMObjective(model, seq, ema_decay=0.9)
    trainer = Trainer(
        objective,
        optax.adamw(1e-2),
        key=jax.random.key(11),
        checkpoint_every=args.checkpoint_every,
        microbatches=args.microbatches,
        fsdp=args.fsdp,
    )
    try:
        state = trainer.fit(Dataset(train=train, batch=rows), steps=args.steps,
                            run_dir=args.run_dir, log_every=1)  # fmt: skip
    except TrainingInterrupted as stopped:
        print("interrupted", stopped.step, stopped.signal_name, stopped.process, flush=True)
        sys.exit(3)
    from dew.trainer.checkpoint import to_host

    leaves = [to_host(x) for x in jax.tree.leaves(state)]
    if jax.process_index() == 0:
        np.savez(args.out, *leaves)
    print("done", int(state.step), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

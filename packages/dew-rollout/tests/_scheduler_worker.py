"""A GRPO training process driven by RolloutScheduler, for the SIGKILL-resume and the
two-process tests (run as a script).

usage: _scheduler_worker.py OUT_NPZ STEPS [--run-dir DIR] [--sleep S]
                            [--processes P --process-id I --port PORT --fail-step K]

Single process: the tiny decoder of rollout_tiny.py serves a PromptSource on a
NativeRolloutServer, one batch ahead, with a WeightJournal in RUN_DIR/journal and a checkpoint
every step; the final parameters go to OUT_NPZ and each SchedulerRecord to stdout as JSON.

Several processes (jax.distributed on 127.0.0.1, one CPU device each): every process runs its
own scheduler over its own task rows with the scripted source of rollout_scripted.py, behind
a Publication whose push only records; from step K on, process 1's source raises. Each
process prints "done" or "error <type>: <message>".
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--sleep", type=float, default=0.0)
    process_arguments(p)
    p.add_argument("--fail-step", type=int, default=0)
    args = p.parse_args()

    join_cpu(1, args.processes, args.process_id, args.port)
    import jax
    import numpy as np
    import optax
    from rollout_tiny import MAX_LEN, MIXED_EOS, VOCAB, WIDTH

    from dew import Trainer
    from dew.data import Dataset
    from dew.inference import Server
    from dew.objectives.rl.grpo import GRPOObjective
    from dew.rollout import (
        NativeRolloutServer,
        PromptSource,
        Publication,
        RolloutScheduler,
        prompt_tasks,
        task_ids,
    )
    from dew.sampling import Sampling
    from dew.testing import tiny_decoder

    rows, groups, prompt_len = 2, 2, 4  # tasks per process
    model = tiny_decoder(VOCAB, MAX_LEN, init_std=0.5)
    variables = GRPOObjective(model, seq_len=WIDTH - 1).init(jax.random.key(0))
    objective = GRPOObjective(model, seq_len=WIDTH - 1, behavior_importance=2.0,
                              pretrained=variables)  # fmt: skip

    def log(record):
        print(json.dumps({"record": record.as_dict()}), flush=True)

    def batches(partition, start=0):
        i = start
        while True:
            rng = np.random.default_rng([7, i, partition.index])
            if args.sleep:
                time.sleep(args.sleep)
            yield {
                "prompt": rng.integers(1, VOCAB, size=(rows, prompt_len)).astype(np.int32),
                "prompt_length": np.full((rows,), prompt_len, np.int32),
                "task_id": (np.arange(rows) + 100 * i + 1000 * partition.index).astype(np.int32),
            }
            i += 1

    data = Dataset(train=batches, batch=rows * args.processes)
    closers = []
    if args.processes == 1:
        core = Server(model, variables, slots=8, capacity=MAX_LEN, steps_per_call=1,
                      min_window=MAX_LEN, sampling=Sampling(temperature=1.0, eos_id=MIXED_EOS))  # fmt: skip
        server = NativeRolloutServer(core)

        def even_share(data_source, completion, ground_truth, extra_info):
            ids = [int(t) for t in completion.split()]
            return sum(i % 2 == 0 for i in ids) / max(1, len(ids))

        source = PromptSource(server, even_share, max_new_tokens=WIDTH - prompt_len)
        closers += [source.close, server.close]
        scheduler = RolloutScheduler(
            objective, source, server, width=WIDTH, rows=rows * groups, tasks=prompt_tasks,
            groups=groups, ahead=1, truncation="score", log=log,
            journal=os.path.join(args.run_dir, "journal") if args.run_dir else None,
        )  # fmt: skip
    else:
        from rollout_scripted import Plan, Scripted

        weights = Publication(lambda host, version: None)
        broken = args.process_id == 1

        def script(task, n):
            step = (task % 1000) // 100 + 1
            return Plan(raise_error=broken and step >= args.fail_step, reward=float(n % 2))

        source = Scripted(script, weights)
        scheduler = RolloutScheduler(objective, source, weights, width=WIDTH,
                                     rows=rows * groups, tasks=task_ids, groups=groups,
                                     ahead=1, log=log)  # fmt: skip
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(1), rollout=scheduler,
                      checkpoint_every=1 if args.run_dir else None, progress=False)  # fmt: skip
    try:
        state = trainer.fit(scheduler.tasks(data), steps=args.steps, run_dir=args.run_dir)
    except Exception as error:  # noqa: BLE001 - reported to the test
        print(f"error {type(error).__name__}: {error}", flush=True)
        scheduler.close()
        sys.stdout.flush()
        os._exit(3)
    finally:
        for close in closers:
            close()
    from dew.trainer.checkpoint import to_host

    leaves = [to_host(x) for x in jax.tree.leaves(state.params)]
    if jax.process_index() == 0:
        np.savez(args.out, *leaves)
    print("done", int(state.step), flush=True)


if __name__ == "__main__":
    main()

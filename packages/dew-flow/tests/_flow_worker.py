"""One Flow-GRPO update in a JAX process pool, for test_flow_processes.py (run as a script).

usage: _flow_worker.py OUT_DIR [--process-id I --processes P --port PORT] [--devices D]

Global source batch: 4 labelled rows, each process reading its own contiguous share; groups of
2, so 8 samples. The reward records which process called it and how many samples it saw. Each
process writes ``OUT_DIR/rows_<i>.npz`` (the labels and rewards of the rows it kept, and the
parameters after the update) and the reward writes ``OUT_DIR/reward_<i>.json``.
"""

from __future__ import annotations

import argparse
import json
import os

from dew.testing.processes import join_cpu, process_arguments

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    process_arguments(p)
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()

    join_cpu(args.devices, args.processes, args.process_id, args.port)
    import itertools

    import jax
    import numpy as np
    import optax

    from dew import Trainer
    from dew.data import Dataset
    from dew.flow import (
        Field,
        FlowGRPOObjective,
        FlowRollout,
        InputSpec,
        LabelEncoder,
        SimpleDiT,
        presets,
    )

    inputs = InputSpec(Field("image", (4, 4, 1)), Field("label", (), "int32"))
    model = SimpleDiT(
        output_channels=1, patch_size=2, emb_features=8, num_layers=1, num_heads=2, mlp_ratio=2
    )
    objective = FlowGRPOObjective(
        model,
        presets.Flow()(),
        inputs,
        steps=4,
        encoders={"label": LabelEncoder(num_classes=4, features=4)},
        epsilon_low=0.2,
        epsilon_high=0.2,
    )
    labels = np.array([0, 1, 2, 3], np.int32)

    def reward(images, batch):
        with open(os.path.join(args.out, f"reward_{jax.process_index()}.json"), "w") as f:
            json.dump({"samples": int(images.shape[0]), "labels": batch["label"].tolist()}, f)
        target = batch["label"].astype(np.float64) / 3.0 - 0.5
        return -np.abs(images.mean(axis=(1, 2, 3)) - target)

    rollout = FlowRollout(objective, reward, groups=2, steps=4)

    def train(partition):
        share = len(labels) // partition.count
        rows = labels[partition.index * share : (partition.index + 1) * share]
        return itertools.repeat({"label": rows})

    data = Dataset(train=train, val=None, records=4, batch=4)
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(3), rollout=rollout)
    kept: dict[str, np.ndarray] = {}
    inner = trainer.rollout

    def recording(variables, batch, key):
        out = inner(variables, batch, key)
        kept.update({"labels": out["label"], "rewards": out["rewards"]})
        return out

    trainer.rollout = recording
    start = trainer.initial_state()
    initial = jax.tree.leaves(jax.device_get(start.params))
    state = trainer.fit(data, steps=1, state=start)
    params = jax.tree.leaves(jax.device_get(state.params))
    np.savez(
        os.path.join(args.out, f"rows_{args.process_id}.npz"),
        labels=kept["labels"],
        rewards=kept["rewards"],
        updates=np.asarray(int(jax.device_get(state.updates))),
        **{f"param_{i}": np.asarray(x) for i, x in enumerate(params)},
        **{f"initial_{i}": np.asarray(x) for i, x in enumerate(initial)},
    )
    print("done", flush=True)


if __name__ == "__main__":
    main()

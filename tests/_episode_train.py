"""A training process for the episode recovery test: GRPO on tool episodes served by
SubprocessEnvironment workers, with an EpisodeJournal, on two CPU devices.

    python _episode_train.py RUN_DIR STEPS

Environment: ``WORKER_AUDIT`` (the tool's audit log), ``WORKER_PAUSE_FILE`` and
``WORKER_PAUSE_STEP`` (the worker of the first tool call of that step hangs), ``JAX_CACHE``
(a persistent compilation cache shared by the test's processes). Every finished episode is
appended to ``RUN_DIR/episodes.jsonl``; at the end the parameters go to ``RUN_DIR/params.npz``.
The optimizer accumulates two steps per update (``optax.MultiSteps``), so step 2 runs in the
middle of an accumulation window and step 3 right after an update.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
if os.environ.get("JAX_CACHE"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

import numpy as np  # noqa: E402
import optax  # noqa: E402

from dew.data.dataset import Dataset  # noqa: E402
from dew.inference import TextGeneration  # noqa: E402
from dew.objectives.rl import EpisodeJournal, EpisodeRollout  # noqa: E402
from dew.objectives.rl.grpo import GRPOObjective  # noqa: E402
from dew.sampling import Sampling  # noqa: E402
from dew.sandbox import SandboxLimits, SubprocessEnvironment  # noqa: E402
from dew.testing import tiny_decoder  # noqa: E402
from dew.trainer import Trainer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "packages" / "dew-sandbox" / "tests" / "square_worker.py")
P, R, K, G = 8, 4, 3, 2


def verifier(episode):
    x = episode.id.task % 10
    return 1.0 if episode.detail == str(x * x) else 0.0


def main(run_dir: str, steps: int) -> None:
    model = tiny_decoder(16, 32, init_std=0.02)
    env = {
        name: os.environ[name]
        for name in ("WORKER_AUDIT", "WORKER_PAUSE_FILE", "WORKER_PAUSE_STEP")
        if name in os.environ
    }
    factory = SubprocessEnvironment(
        [sys.executable, WORKER], SandboxLimits(cpu_seconds=30, deadline_seconds=3600), env=env
    )
    log = open(os.path.join(run_dir, "episodes.jsonl"), "a")

    def record(episode):
        entry = {
            "id": episode.id.as_dict(),
            "status": episode.status.value,
            "reward": episode.reward,
            "actions": [
                [a.tokens.tolist(), a.raw_log_probs.tolist(), a.behavior_log_probs.tolist()]
                for a in episode.actions
            ],
        }
        log.write(json.dumps(entry, sort_keys=True) + "\n")
        log.flush()

    rollout = EpisodeRollout(
        TextGeneration(model),
        factory,
        verifier,
        P,
        R,
        K,
        G,
        Sampling(eos_id=(1, 2, 3, 4, 5)),
        journal=EpisodeJournal(os.path.join(run_dir, "journal")),
        record=record,
        # one tool call in flight at a time: when the run is killed, only the paused call is
        # between its pending and completed records (concurrent calls could be caught in
        # that window too and then, as documented, run a second time)
        environment_threads=1,
    )
    objective = GRPOObjective(model, seq_len=P + R - 1)
    optimizer = optax.MultiSteps(optax.sgd(0.5), every_k_schedule=2)
    batches = [{"task_id": np.arange(4) + 4 * i} for i in range(steps)]

    def train(partition, start=0):
        return iter(batches[start:])

    data = Dataset(train=train, batch=4)
    trainer = Trainer(
        objective, optimizer, key=jax.random.key(5), rollout=rollout, checkpoint_every=1
    )
    state = trainer.fit(data, steps=steps, run_dir=run_dir)
    leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
    np.savez(os.path.join(run_dir, "params.npz"), *leaves)
    rollout.journal.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

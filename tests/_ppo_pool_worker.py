"""One process of the PPO pool test (see test_ppo_pool.py).

    python _ppo_pool_worker.py OUT --processes N --process-id I --port P --devices D

Two PPO updates (policy and critic) on cohorts of two tasks whose episodes take one turn
(even tasks) or two (odd tasks), sampled with device shards; writes this process's rows of
every batch PPORollout made (old values, whitened advantages, returns, the action mask and
episode numbers) and, on rank 0, the final parameters.
"""

from __future__ import annotations

import argparse
import json
import os

from dew.testing.processes import join_cpu, process_arguments

TARGETS = ("old_values", "advantages", "returns", "response_mask", "session_index")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    process_arguments(parser)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()

    import jax

    if os.environ.get("JAX_CACHE"):
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    join_cpu(args.devices, args.processes, args.process_id, args.port)
    import numpy as np
    import optax

    from dew.data.dataset import Dataset
    from dew.inference import TextGeneration
    from dew.objectives.rl import EpisodeRollout, PPOObjective, PPORollout, ValueHead
    from dew.rollouts.episodes import EpisodeStatus, Observation
    from dew.sampling import Sampling
    from dew.testing import tiny_decoder
    from dew.trainer import Trainer

    rank = jax.process_index()
    P, R, K, G = 8, 4, 2, 4

    class Turns:
        """Even tasks end after one turn, odd ones after two."""

        def __init__(self, episode_id):
            self.id, self.turns = episode_id, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def reset(self):
            return Observation([14, 4 + self.id.task % 10])

        def step(self, action):
            self.turns += 1
            if self.turns >= (1 if self.id.task % 2 == 0 else 2):
                return Observation(None, EpisodeStatus.COMPLETED, str(self.turns))
            return Observation([*action.context.tolist(), *action.tokens.tolist(), 15])

    def verifier(episode):
        return float(sum(len(a.tokens) for a in episode.actions)) / 4.0

    model = tiny_decoder(16, 32, init_std=0.02)
    critic = ValueHead(tiny_decoder(16, 32, init_std=0.02))
    objective = PPOObjective(model, seq_len=P + R - 1, critic=critic)
    per_rank = 2 // jax.process_count()
    local_tasks = np.arange(2)[rank * per_rank : (rank + 1) * per_rank]
    episodes = EpisodeRollout(TextGeneration(model), Turns, verifier, P, R, K, G,
                              Sampling(eos_id=(1, 2, 3, 4, 5)), device_shards=True)  # fmt: skip
    rollout = PPORollout(objective, episodes, gamma=0.97, lam=0.9)
    batches = []

    def hook(variables, batch, key):
        packed = rollout(variables, batch, key)
        batches.append({k: np.asarray(packed[k]).tolist() for k in TARGETS})
        return packed

    hook.at_step = rollout.at_step
    data = Dataset(train=lambda part: iter([{"task_id": local_tasks}] * 2), batch=2)
    trainer = Trainer(objective, optax.sgd(0.5), key=jax.random.key(3), rollout=hook)
    state = trainer.fit(data, steps=2)
    out = {"rank": rank, "batches": batches, "updates": int(jax.device_get(state.updates))}
    if rank == 0:
        leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
        np.savez(os.path.join(args.out, f"params-{args.processes}.npz"), *leaves)
    with open(os.path.join(args.out, f"ppo-{args.processes}-{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()

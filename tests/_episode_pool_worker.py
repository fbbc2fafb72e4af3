"""One process of the episode pool test (see test_episode_pool.py).

    python _episode_pool_worker.py OUT MODE --processes N --process-id I --port P --devices D

MODE ``train``: two GRPO steps on a cohort of two tasks whose episodes take different turn
counts (even tasks end after one turn, odd tasks after three); writes every finished episode,
every packed batch (this process's rows) and the final parameters. MODE ``faults``: first a
collection whose configuration differs on rank 1, then one whose tool fails on rank 1; writes
what each rank raised and how many environments it left open.
"""

from __future__ import annotations

import argparse
import json
import os

from dew.testing.processes import join_cpu, process_arguments


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=("train", "faults"))
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
    from dew.objectives.rl import EpisodeRollout
    from dew.objectives.rl.grpo import GRPOObjective
    from dew.rollouts.episodes import EpisodeStatus, Observation
    from dew.rollouts.episodes.cohort import CohortMismatch
    from dew.sampling import Sampling
    from dew.testing import tiny_decoder
    from dew.trainer import Trainer

    rank = jax.process_index()
    P, R, K, G = 8, 4, 3, 2
    opened: set = set()

    class Counting:
        """Even tasks end after one turn, odd ones after three; fails when told."""

        def __init__(self, episode_id, fail=False):
            self.id, self.fail, self.turns = episode_id, fail, 0

        def __enter__(self):
            opened.add(self.id)
            return self

        def __exit__(self, *exc):
            opened.discard(self.id)

        def reset(self):
            return Observation([14, 4 + self.id.task % 10])

        def step(self, action):
            self.turns += 1
            if self.fail and self.turns == 1:
                raise RuntimeError(f"tool failure on rank {rank}")
            if self.turns >= (1 if self.id.task % 2 == 0 else 3):
                return Observation(None, EpisodeStatus.COMPLETED, str(self.turns))
            return Observation([*action.context.tolist(), *action.tokens.tolist(), 15])

    def verifier(episode):
        return float(len(episode.actions[-1].tokens)) if episode.actions else 0.0

    model = tiny_decoder(16, 32, init_std=0.02)
    objective = GRPOObjective(model, seq_len=P + R - 1)
    sampling = Sampling(eos_id=(1, 2, 3, 4, 5))
    per_rank = 2 // jax.process_count()
    local_tasks = np.arange(2)[rank * per_rank : (rank + 1) * per_rank]
    out = {"rank": rank}

    if args.mode == "train":
        episodes, batches = [], []
        rollout = EpisodeRollout(
            TextGeneration(model),
            lambda i: Counting(i),
            verifier,
            P,
            R,
            K,
            G,
            sampling,
            device_shards=True,
            record=lambda e: episodes.append(
                {
                    "id": e.id.as_dict(),
                    "status": e.status.value,
                    "reward": e.reward,
                    "tokens": [a.tokens.tolist() for a in e.actions],
                    "raw": [a.raw_log_probs.tolist() for a in e.actions],
                    "behavior": [a.behavior_log_probs.tolist() for a in e.actions],
                }
            ),
        )

        def hook(variables, batch, key):
            packed = rollout(variables, batch, key)
            batches.append({k: np.asarray(v).tolist() for k, v in packed.items()})
            return packed

        hook.at_step = rollout.at_step
        data = Dataset(train=lambda part: iter([{"task_id": local_tasks}] * 2), batch=2)
        trainer = Trainer(objective, optax.sgd(0.5), key=jax.random.key(3), rollout=hook)
        state = trainer.fit(data, steps=2)
        out.update(episodes=episodes, batches=batches, open=len(opened))
        if rank == 0:
            leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
            np.savez(os.path.join(args.out, f"params-{args.processes}.npz"), *leaves)
    else:
        variables = objective.init(jax.random.key(0))
        budget = R + 1 if rank == 1 else R  # rank 1 disagrees on max_new_tokens
        mismatched = EpisodeRollout(
            TextGeneration(model), lambda i: Counting(i), verifier, P, budget, K, G, sampling
        )
        try:
            mismatched(variables, {"task_id": local_tasks}, jax.random.key(1))
            out["mismatch"] = "no error"
        except CohortMismatch as err:
            out["mismatch"] = f"CohortMismatch: {err}"
        out["opened_after_mismatch"] = len(opened)
        failing = EpisodeRollout(
            TextGeneration(model),
            lambda i: Counting(i, fail=rank == 1),
            verifier,
            P,
            R,
            K,
            G,
            sampling,
        )
        try:
            failing(variables, {"task_id": np.asarray([1] * per_rank)}, jax.random.key(1))
            out["failure"] = "no error"
        except Exception as err:  # noqa: BLE001 - the test reads what each rank raised
            out["failure"] = f"{type(err).__name__}: {err} <- {type(err.__cause__).__name__}"
        out["open"] = len(opened)
    name = f"{args.mode}-{args.processes}-{rank}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()

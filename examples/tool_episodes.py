"""A tiny decoder learns, with GRPO on tool episodes, to call a square tool and say its result.

The task: the context shows ``[QUESTION, x]`` for a digit ``x`` in 0..3. A turn
``[CALL, EOS]`` asks the tool, which appends the digit of ``x * x``; a turn
``[SAY, digit, EOS]`` answers and ends the episode. The verifier pays 1 for the right digit.

1. A format warm-up (a few next-token steps with ``LMObjective``) on transcripts that call
   the tool and then say a *random* digit: the policy learns the protocol, not the answer,
   so it starts near a 10% success rate.
2. GRPO through ``EpisodeRollout``: each step collects ``groups`` episodes per task, every
   slot sampled together per round by ``TextGeneration``, packed into
   ``[B * G * K, P + R]`` rows and trained by ``GRPOObjective``. To succeed the policy has to
   copy the digit the tool returned.

The held-out success rate (greedy decoding on task ids never trained on) is printed before
and after. Swap the in-process tool for ``dew.sandbox.SubprocessEnvironment`` to run each
episode's tool in its own limited process.

Run::

    JAX_PLATFORMS=cpu uv run python examples/tool_episodes.py [--steps 40]
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import jax
import numpy as np
import optax

import dew.models
from dew import Trainer
from dew.data import Dataset
from dew.inference import TextGeneration
from dew.objectives.lm import LMObjective
from dew.objectives.rl import EpisodeRollout, GRPOObjective
from dew.rollouts.episodes import EpisodeStatus, Observation
from dew.sampling import Sampling

EOS, CALL, SAY, QUESTION, VOCAB = 1, 2, 3, 14, 16
P, R, K = 8, 3, 2  # context budget, response budget, turns


def digit(n: int) -> int:
    return 4 + n


class SquareTool:
    """The environment of one episode (in-process; see SubprocessEnvironment for a worker)."""

    def __init__(self, episode_id: Any) -> None:
        self.x = episode_id.task % 4

    def __enter__(self) -> SquareTool:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def reset(self) -> Observation:
        return Observation([QUESTION, digit(self.x)])

    def step(self, action: Any) -> Observation:
        body = [int(t) for t in action.tokens if int(t) != EOS]
        if body == [CALL]:
            return Observation(
                [*action.context.tolist(), *action.tokens.tolist(), digit(self.x**2)]
            )
        if len(body) == 2 and body[0] == SAY:
            return Observation(None, EpisodeStatus.COMPLETED, str(body[1] - 4))
        return Observation(None, EpisodeStatus.COMPLETED, "invalid")


def verifier(episode: Any) -> float:
    return 1.0 if episode.detail == str((episode.id.task % 4) ** 2) else 0.0


def warmup_batch(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Transcripts with the right protocol and a random answer digit."""
    x = rng.integers(0, 4, rows)
    said = rng.integers(0, 10, rows)
    text = np.stack(
        [
            np.full(rows, QUESTION),
            digit(x),
            np.full(rows, CALL),
            np.full(rows, EOS),
            digit(x**2),
            np.full(rows, SAY),
            digit(said),
            np.full(rows, EOS),
        ],
        axis=1,
    ).astype(np.int32)
    return {"text": text}


def success(model: Any, variables: Any, tasks: np.ndarray) -> float:
    """Mean verifier reward with greedy decoding on ``tasks``."""
    rollout = EpisodeRollout(
        TextGeneration(model), SquareTool, verifier, P, R, K, 1, Sampling(temperature=0, eos_id=EOS)
    )
    episodes = rollout.collect(variables, [int(t) for t in tasks], jax.random.key(0))
    return float(np.mean([e.reward for e in episodes]))


def main(
    steps: int = 40, warmup: int = 60, seed: int = 0, quiet: bool = False
) -> tuple[float, float]:
    model = dew.models.build(
        "causal_transformer",
        vocab_size=VOCAB,
        emb_features=32,
        num_layers=2,
        num_heads=2,
        mlp_features=64,
        max_seq_len=32,
    )
    rng = np.random.default_rng(seed)
    lm = LMObjective(model, seq_len=7, ema_decay=None)
    warm = Dataset(train=lambda part: (warmup_batch(rng, 64) for _ in itertools.count()), batch=64)
    prior = Trainer(lm, optax.adam(1e-2), key=jax.random.key(seed), progress=False).fit(
        warm, steps=warmup
    )
    held_out = np.arange(1000, 1016)  # task ids never trained on (x = id % 4)
    before = success(model, prior.params, held_out)

    groups, rows = 8, 8
    rollout = EpisodeRollout(
        TextGeneration(model),
        SquareTool,
        verifier,
        P,
        R,
        K,
        groups,
        Sampling(eos_id=EOS, temperature=1.0),
    )
    objective = GRPOObjective(model, seq_len=P + R - 1, pretrained=jax.device_get(prior.params))
    tasks = Dataset(
        train=lambda part: ({"task_id": rng.integers(0, 1000, rows)} for _ in itertools.count()),
        batch=rows,
    )
    trainer = Trainer(
        objective, optax.adam(3e-3), key=jax.random.key(seed + 1), rollout=rollout, progress=False
    )
    state = trainer.fit(tasks, steps=steps)
    after = success(model, state.params, held_out)
    if not quiet:
        print(f"held-out success before GRPO: {before:.2f}  after {steps} steps: {after:.2f}")
    return before, after


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.steps, args.warmup, args.seed)

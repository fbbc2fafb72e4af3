"""PPO with a critic against GRPO on a square tool, same sampling budget, printed side by side.

The task: the context shows ``[QUESTION, x]`` for a digit ``x`` in 0..3. The policy may call
the tool with ``[CALL, EOS]``, which appends the digit of ``x * x``, and must then answer
``[SAY, digit, EOS]``. The verifier pays 1 for the right digit, 0 otherwise.

The policy is a trigram table (the logits of the next id depend on the two ids before it),
started from a prior that knows the protocol (call, then say a digit, then stop) but not which
digit to say: after ``SAY`` every digit is equally likely, so it starts near a 10% success
rate. Learning to succeed means learning to repeat the digit the tool returned. PPO adds a
critic (a ValueHead on trainable token features); GRPO judges each episode against the other
episodes of its task. Both see the same tasks, the same number of episodes per update and the
same number of updates.

Run::

    JAX_PLATFORMS=cpu uv run python examples/ppo_tool.py [--steps 25]
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset
from dew.objectives.rl import EpisodeRollout, GRPOObjective, PPOObjective, PPORollout, ValueHead
from dew.rollouts.episodes import EpisodeStatus, Observation
from dew.rollouts.policy import SubtreePolicy
from dew.sampling import Sampling

PAD, EOS, CALL, SAY, QUESTION, VOCAB = 0, 1, 2, 3, 14, 16
DIGITS = list(range(4, 14))
P, R, K = 8, 3, 2  # context budget, response budget, turns


class SquareTool:
    def __init__(self, episode_id: Any) -> None:
        self.x = episode_id.task % 4

    def __enter__(self) -> SquareTool:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def reset(self) -> Observation:
        return Observation([QUESTION, 4 + self.x])

    def step(self, action: Any) -> Observation:
        body = [int(t) for t in action.tokens if int(t) != EOS]
        if body == [CALL]:
            context = [*action.context.tolist(), *action.tokens.tolist()]
            return Observation([*context, 4 + self.x * self.x])
        said = body[1:2] if body[:1] == [SAY] and len(body) == 2 else []
        detail = str(said[0] - 4) if said and said[0] in DIGITS else "invalid"
        return Observation(None, EpisodeStatus.COMPLETED, detail)


def verify(episode: Any) -> float:
    return 1.0 if episode.detail == str((episode.id.task % 4) ** 2) else 0.0


def protocol_prior(key: Any, shape: tuple[int, ...]) -> jax.Array:
    """Logits ``[prev2, prev1, next]`` that know the protocol, not the answer."""
    table = np.zeros(shape, np.float32)
    table[QUESTION, DIGITS, CALL] = 5.0  # after the question: call the tool
    table[:, CALL, EOS] = 6.0  # ... and end the turn
    table[EOS, DIGITS, SAY] = 5.0  # after the tool's digit: say something
    table[:, SAY, 4:14] = 3.0  # ... a digit, any digit
    table[SAY, DIGITS, EOS] = 6.0  # ... and stop
    return jnp.asarray(table)


class Trigram(nn.Module):
    @nn.compact
    def __call__(self, input_ids: Any, segment_ids: Any = None, positions: Any = None) -> Any:
        table = self.param("table", protocol_prior, (VOCAB, VOCAB, VOCAB))
        if segment_ids is None:
            segment_ids = jnp.ones_like(input_ids)
        before = jnp.pad(input_ids[:, :-1], ((0, 0), (1, 0)))
        same = jnp.pad(segment_ids[:, 1:] == segment_ids[:, :-1], ((0, 0), (1, 0)))
        return table[jnp.where(same, before, PAD), input_ids]


class TokenFeatures(nn.Module):
    def setup(self) -> None:
        self.embed = nn.Embed(VOCAB, 8)

    def hidden_states(self, input_ids: Any, segment_ids: Any = None, positions: Any = None):
        return self.embed(input_ids)

    def __call__(self, input_ids: Any, segment_ids: Any = None, positions: Any = None):
        return self.hidden_states(input_ids)


def success_rate(model: Any, variables: Any, key: Any, episodes: int = 256) -> float:
    """Sampled success rate of ``episodes`` fresh episodes (tasks 0..3 in turn)."""
    rollout = EpisodeRollout(
        SubtreePolicy(model, variables), SquareTool, verify, P, R, K,
        groups=episodes // 4, sampling=Sampling(eos_id=EOS), progress=False,
    )  # fmt: skip
    done = rollout.collect(variables, list(range(4)), key)
    return float(np.mean([e.reward or 0.0 for e in done]))


def train(kind: str, steps: int, groups: int, key: Any) -> tuple[list[float], float]:
    model = Trigram()
    sampling = Sampling(eos_id=EOS)
    if kind == "ppo":
        objective: Any = PPOObjective(
            model, P + R - 1, critic=ValueHead(TokenFeatures()), beta=0.0,
            value_coefficient=0.5, epsilon_high=0.28,
        )  # fmt: skip
        episodes = EpisodeRollout(
            objective.policy(objective.init(key)), SquareTool, verify, P, R, K, groups,
            sampling, progress=False,
        )  # fmt: skip
        rollout: Any = PPORollout(objective, episodes, gamma=1.0, lam=0.95)
        policy_of = objective.policy_variables
    else:
        objective = GRPOObjective(model, P + R - 1, epsilon_high=0.28)
        policy = SubtreePolicy(model, objective.init(key))
        rollout = EpisodeRollout(policy, SquareTool, verify, P, R, K, groups, sampling)
        rollout.progress = False
        policy_of = dict
    rewards: list[float] = []

    def recording(variables: Any, batch: Any, key: Any) -> Any:
        out = rollout(variables, batch, key)
        rewards.append(float(np.mean(out["rewards"])))
        return out

    recording.at_step = rollout.at_step  # type: ignore[attr-defined]
    data = Dataset(
        train=lambda partition: itertools.repeat({"task_id": np.arange(4, dtype=np.int32)}),
        batch=4,
    )
    trainer = Trainer(objective, optax.adam(0.1), key=key, rollout=recording, progress=False)
    state = trainer.fit(data, steps=steps, log_every=None)
    final = success_rate(model, policy_of(jax.device_get(state.params)), jax.random.key(99))
    return rewards, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--groups", type=int, default=8, help="episodes per task and update")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    key = jax.random.key(args.seed)
    start = success_rate(Trigram(), Trigram().init(key, jnp.zeros((1, 2), jnp.int32)), key)
    print(f"budget: {args.steps} updates x {4 * args.groups} episodes, up to {K} turns each")
    print(f"starting policy: success rate {start:.3f} (256 sampled episodes)")
    results = {}
    for kind in ("ppo", "grpo"):
        began = time.perf_counter()
        rewards, final = train(kind, args.steps, args.groups, key)
        results[kind] = (rewards, final, time.perf_counter() - began)
    print(f"{'update':>6} {'PPO reward':>11} {'GRPO reward':>12}")
    for i, (a, b) in enumerate(zip(results["ppo"][0], results["grpo"][0]), start=1):
        if i == 1 or i % 5 == 0 or i == args.steps:
            print(f"{i:>6} {a:>11.3f} {b:>12.3f}")
    for kind, (_, final, seconds) in results.items():
        print(
            f"{kind.upper():>4}: success rate {start:.3f} -> {final:.3f} "
            f"(256 sampled episodes after training, {seconds:.0f} s)"
        )


if __name__ == "__main__":
    main()

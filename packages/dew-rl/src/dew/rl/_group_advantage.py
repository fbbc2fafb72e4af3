"""Group-relative (GRPO) advantage."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank

#: verl's ``epsilon`` default in ``compute_grpo_outcome_advantage``.
GROUP_EPS = 1e-6


def check_groups(rewards: jax.Array, group: int) -> None:
    """Raise unless ``rewards`` is ``[B]`` floats and ``group`` divides ``B``."""
    require_float("rewards", rewards)
    require_rank("rewards", rewards, 1, "[B]")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group: expected a positive Python int, got {group!r}")
    if rewards.shape[0] % group:
        raise ValueError(
            f"rewards: expected a length divisible by group={group}, got {rewards.shape[0]}"
        )


def group_advantage(
    rewards: jax.Array,
    group: int,
    normalise_by_std: bool = True,
    eps: float = GROUP_EPS,
) -> jax.Array:
    """GRPO's advantage: each reward against its group's mean, over the group's deviation.

    Port of verl 0.9.1 ``compute_grpo_outcome_advantage`` for outcome rewards. The rollout
    lays the ``group`` completions of one prompt next to each other, so groups are a
    reshape of ``[B]`` into ``[B / group, group]`` (verl's ``index`` column also allows
    ragged groups; Dew's rollouts never make them). The deviation is unbiased
    (``torch.std``): ``(r - mean) / (std + eps)``. ``normalise_by_std=False`` is Dr.GRPO
    (arXiv:2503.20783), ``r - mean``; verl calls that switch
    ``norm_adv_by_std_in_grpo``.

    Edge cases, as in verl: a group with zero spread gives zeros; a group of one has mean
    0 and deviation 1, so its advantage is ``r / (1 + eps)`` (just ``r`` without the
    deviation); verl adds that ``1 + eps`` in float32, and so does this. ``group`` and
    ``normalise_by_std`` are static under ``jax.jit``.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group: completions per prompt (a Python int dividing ``B``).
      normalise_by_std: divide by the group deviation (GRPO) or not (Dr.GRPO).
      eps: added to the deviation, verl's ``epsilon``.

    Returns:
      ``[B]`` advantages in the rewards' dtype; broadcast over tokens with
      ``adv[:, None]`` and mask there.
    """
    check_groups(rewards, group)
    grouped = rewards.reshape(-1, group)
    if group == 1:
        if not normalise_by_std:
            return rewards
        scale = (jnp.float32(1.0) + jnp.float32(eps)).astype(rewards.dtype)
        return rewards / scale
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    centred = grouped - mean
    if normalise_by_std:
        std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)
        centred = centred / (std + eps)
    return centred.reshape(-1)

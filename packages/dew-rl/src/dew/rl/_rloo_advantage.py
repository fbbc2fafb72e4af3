"""Leave-one-out (RLOO) advantage."""

# Ports Tunix (Apache License 2.0, Copyright 2025 Google LLC) and verl 0.9.1
# (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._group_advantage import check_groups


def rloo_advantage(rewards: jax.Array, group: int) -> jax.Array:
    """Each completion's reward minus the mean reward of the rest of its group.

    ``r_i - mean_{j != i} r_j`` (arXiv:2402.14740), computed in that leave-one-out form as
    Tunix does; it equals ``group / (group - 1)`` times the centred reward
    ``r_i - mean_j r_j``, the form verl 0.9.1 ``compute_rloo_outcome_advantage`` writes
    (the two differ only in rounding). Groups are adjacent runs of ``group`` rewards, as
    in :func:`group_advantage`.

    A group of one has no other completion to compare with; like verl's ``rloo``
    estimator, its reward is returned unchanged (the empty baseline counts as 0).
    ``group`` is static under ``jax.jit``.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group: completions per prompt (a Python int dividing ``B``).

    Returns:
      ``[B]`` advantages in the rewards' dtype.
    """
    check_groups(rewards, group)
    if group == 1:
        return rewards
    grouped = rewards.reshape(-1, group)
    others = jnp.sum(grouped, axis=1, keepdims=True) - grouped
    baseline = others / (group - 1)
    return (grouped - baseline).reshape(-1)

"""Generalized advantage estimation."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank, require_same_dtype, require_same_shape
from dew.rl._masked_whiten import masked_whiten
from dew.rl._masking import at_least_float32, keep_of


def gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation (arXiv:1506.02438) over ``[B, T]`` steps.

    Port of verl 0.9.1 ``compute_gae_advantage_return``. Walking backwards from the last
    step, ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam *
    A_next``. A step outside the mask contributes nothing: it passes the running advantage
    and the next value through unchanged, so a padded tail (or observation tokens inside a
    multi-turn episode) leaves the kept steps exactly as if it were absent. Positions
    outside the mask hold the carried advantage, for the loss to mask again.

    ``returns = A + V`` is taken before whitening; the advantages are then whitened with
    :func:`masked_whiten`. Everything runs in at least float32 (bfloat16 or float16 input
    is upcast and float32 comes back; float64 stays float64), and nothing here carries a
    gradient (verl runs it under ``torch.no_grad``). Selection is done with ``jnp.where``,
    so a nan in a masked reward or value cannot reach a kept step.

    Args:
      token_rewards: ``[B, T]`` per-step rewards.
      values: ``[B, T]`` critic values at rollout time, same dtype.
      mask: ``[B, T]``; non-zero marks a real (response) step.
      gamma: discount factor.
      lam: GAE lambda.

    Returns:
      ``(advantages, returns)``: whitened advantages and unwhitened returns, both
      ``[B, T]`` in ``promote(dtype, float32)``. With exactly one kept step in the batch
      the whitening divides by zero and the advantages are nan (see
      :func:`masked_whiten`).
    """
    require_float("token_rewards", token_rewards)
    require_rank("token_rewards", token_rewards, 2, "[B, T]")
    require_same_shape("values", values, "token_rewards", token_rewards)
    require_same_dtype("values", values, "token_rewards", token_rewards)
    require_same_shape("mask", mask, "token_rewards", token_rewards)
    dtype = at_least_float32(token_rewards.dtype)
    rewards = jax.lax.stop_gradient(token_rewards).astype(dtype)
    values = jax.lax.stop_gradient(values).astype(dtype)
    keep = keep_of(mask)
    decay = gamma * lam

    # The carry holds the next value and the next advantage already multiplied by gamma
    # and by gamma * lam. Each product is then rounded and stored before the next step adds
    # it, so XLA cannot contract the product and the sum into one fused multiply-add,
    # which rounds once where torch rounds twice.
    def step(
        carry: tuple[jax.Array, jax.Array, jax.Array],
        inputs: tuple[jax.Array, jax.Array, jax.Array],
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], jax.Array]:
        discounted_value, discounted_advantage, last_advantage = carry
        reward, value, kept = inputs
        delta = reward + discounted_value - value
        advantage = delta + discounted_advantage
        discounted_value = jnp.where(kept, gamma * value, discounted_value)
        discounted_advantage = jnp.where(kept, decay * advantage, discounted_advantage)
        last_advantage = jnp.where(kept, advantage, last_advantage)
        return (discounted_value, discounted_advantage, last_advantage), last_advantage

    batch = rewards.shape[0]
    zeros = jnp.zeros((batch,), dtype)
    _, advantages = jax.lax.scan(
        step, (zeros, zeros, zeros), (rewards.T, values.T, keep.T), reverse=True
    )
    advantages = advantages.T
    returns = advantages + values
    return masked_whiten(advantages, mask), returns

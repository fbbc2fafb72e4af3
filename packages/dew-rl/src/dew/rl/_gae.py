"""Token-level advantages: generalized advantage estimation and masked whitening.

``gae`` walks ``[B, T]`` per-step rewards and critic values backwards and whitens the result
with the same statistics ``masked_whiten`` exposes on its own: a masked mean and a
Bessel-corrected masked variance over every kept position of the batch. Everything runs in
at least float32 and under ``stop_gradient``; the group baselines of outcome rewards live in
``_group``.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank, require_same_dtype, require_same_shape
from dew.rl._masking import at_least_float32, count_dtype, count_kept, keep_of, mean_with_eps

#: verl adds this to the variance before the reciprocal square root.
WHITEN_EPS = 1e-8


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

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
      >>> values = jnp.array([[0.5, 0.5, 0.5], [0.2, 0.4, 0.0]])
      >>> mask = jnp.array([[1, 1, 1], [1, 1, 0]])  # the second row ends one step early
      >>> advantages, returns = rl.gae(rewards, values, mask, gamma=1.0, lam=1.0)
      >>> print(returns)  # undiscounted: the reward still to come (0 past the end)
      [[1. 1. 1.]
       [1. 1. 0.]]
      >>> print(advantages.shape)  # whitened over the five kept steps
      (2, 3)

    References:
      Schulman et al., `High-Dimensional Continuous Control Using Generalized Advantage
      Estimation <https://arxiv.org/abs/1506.02438>`_, 2016.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_gae_advantage_return``.
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
    return _whiten(advantages, mask), returns


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Centre ``x`` on its masked mean and divide by its masked, Bessel-corrected deviation.

    Port of verl 0.9.1 ``verl.utils.torch_functional.masked_whiten`` with ``masked_var``
    (``unbiased=True``): ``(x - mean) * rsqrt(var * n / (n - 1) + 1e-8)``, where the mean
    and the variance are :func:`masked_mean` over all axes and ``n`` is the kept count.
    verl's ``n / (n - 1)`` divides two int64 tensors, which torch does in float32; that is
    reproduced, so float64 input matches verl bit for bit.

    The arithmetic runs in at least float32: bfloat16 or float16 input is upcast and the
    result stays float32 (the centring subtracts close numbers that half precision would
    round to zero). float64 stays float64.

    Edge cases, which verl refuses with an exception and a jitted function cannot:
    one kept position gives 0 * inf = nan everywhere; no kept position gives ``x * 1e4``.
    Positions outside the mask are whitened with the same statistics and left in the
    output for the caller to mask again.

    Args:
      x: ``[B, T]`` (any shape) floating values.
      mask: same shape; non-zero keeps a position.

    Returns:
      Same shape as ``x``, dtype ``promote(x.dtype, float32)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> import numpy as np
      >>> x = jnp.array([[1.0, 2.0, 3.0, 100.0]])
      >>> mask = jnp.array([[True, True, True, False]])  # 100.0 is padding
      >>> print(np.asarray(rl.masked_whiten(x, mask)[:, :3]).round(3))  # deviation 1
      [[-1.  0.  1.]]

    References:
      verl 0.9.1, ``verl/utils/torch_functional.py``, ``masked_whiten`` and ``masked_var``.
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    return _whiten(x, mask)


def _whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """:func:`masked_whiten` without the argument checks."""
    x = x.astype(at_least_float32(x.dtype))
    keep = keep_of(mask)
    mean = mean_with_eps(x, mask)
    centred = x - mean
    variance = mean_with_eps(centred**2, mask)
    n = count_kept(keep)
    cdtype = count_dtype(mask)
    bessel = n.astype(cdtype) / (n - 1).astype(cdtype)
    variance = variance * bessel.astype(x.dtype)
    return centred * jax.lax.rsqrt(variance + jnp.asarray(WHITEN_EPS, x.dtype))

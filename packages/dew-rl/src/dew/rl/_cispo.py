"""CISPO's policy surrogate: a detached, clipped ratio weighting the log-likelihood.

Unlike PPO's clip (``_clipped_surrogate``), no token's gradient is cut off: the clip only
bounds the weight ``[B, T]`` each token's ``log pi`` gradient carries.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_dtype, require_same_shape
from dew.rl._masking import LOG_RATIO_BOUND, clamp, keep_of, mean_with_eps, select


def cispo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO's per-token loss ``-sg(clip(r)) * A * log pi`` and verl's metrics.

    Port of verl 0.9.1 ``compute_policy_loss_cispo`` before its ``agg_loss`` call
    (arXiv:2506.13585). The ratio ``r = exp(clamp(log pi - log pi_old, -20, 20))`` is
    clipped to ``[1 - epsilon_low, 1 + epsilon_high]`` and detached, so the gradient flows
    only through ``log pi``, weighted by the clipped ratio; no token's gradient is zeroed
    by the clip, unlike PPO. Reduce the terms with :func:`token_mean` (verl's default) or
    a sequence reduction.

    Positions outside the mask are replaced before any arithmetic; their terms are 0 and
    a nan there reaches neither terms, metrics nor gradients.

    Args:
      log_probs: ``[B, T]`` live log-probabilities of the taken tokens.
      old_log_probs: ``[B, T]`` sampling-time log-probabilities, same dtype.
      advantages: ``[B, T]`` advantages, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      epsilon_low: lower clip range.
      epsilon_high: upper clip range.

    Returns:
      ``(terms, metrics)``: ``[B, T]`` terms and scalars without gradient:
      ``pg_clipfrac`` (float32 share of kept tokens whose ratio was clipped), and
      ``ppo_kl`` (masked mean of minus the clamped log ratio).

    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.log(jnp.array([[0.5, 0.9]]))
      >>> old_log_probs = jnp.log(jnp.array([[0.25, 0.9]]))  # the first ratio is 2
      >>> advantages = jnp.array([[1.0, 1.0]])
      >>> mask = jnp.ones((1, 2), bool)
      >>> def loss(lp):
      ...     return rl.cispo_terms(lp, old_log_probs, advantages, mask)[0].sum()
      >>> print(jax.grad(loss)(log_probs))  # the ratio 2 is clipped to 1.2, not zeroed
      [[-1.2 -1. ]]

    References:
      MiniMax, `MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention
      <https://arxiv.org/abs/2506.13585>`_, 2025 (CISPO).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_cispo``.
    """
    require_float("log_probs", log_probs)
    for name, value in (("old_log_probs", old_log_probs), ("advantages", advantages)):
        require_same_shape(name, value, "log_probs", log_probs)
        require_same_dtype(name, value, "log_probs", log_probs)
    require_same_shape("mask", mask, "log_probs", log_probs)
    keep = keep_of(mask)
    log_probs = select(log_probs, keep)
    old_log_probs = select(old_log_probs, keep)
    advantages = select(advantages, keep)

    log_ratio = clamp(log_probs - old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = jnp.exp(log_ratio)
    clipped = clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    terms = -jax.lax.stop_gradient(clipped) * advantages * log_probs
    metrics = {
        "pg_clipfrac": mean_with_eps((ratio != clipped).astype(jnp.float32), mask),
        "ppo_kl": mean_with_eps(-log_ratio, mask),
    }
    return select(terms, keep), jax.lax.stop_gradient(metrics)

"""IcePop token weights: importance ratios kept only inside a band."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._behavior_importance_weights import raw_weights
from dew.rl._checks import (
    require_float,
    require_positive_band,
    require_same_dtype,
    require_same_shape,
)
from dew.rl._masking import keep_of


def icepop_weights(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    low: float,
    high: float,
) -> jax.Array:
    """Detached token weights ``exp(old - behavior)``, zeroed outside ``[low, high]``.

    Port of verl 0.9.1 ``compute_rollout_correction_weights`` with ``rollout_is="token"``
    and a ``"low_high"`` threshold string (IcePop): the ratio of the trainer's to the
    engine's probability (log ratio clamped to +-20) is kept where ``low <= w <= high``
    and replaced by 0 elsewhere, instead of being capped as in
    :func:`behavior_importance_weights`. Padding gets 0.

    Args:
      old_log_probs: ``[B, T]`` trainer-side log-probabilities of the sampled tokens.
      behavior_log_probs: ``[B, T]`` engine-side log-probabilities, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      low: lowest kept ratio (> 0).
      high: highest kept ratio (>= low).

    Returns:
      ``[B, T]`` weights in the inputs' dtype, without gradient.
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    require_positive_band(low, high)
    weights = raw_weights(old_log_probs, behavior_log_probs, keep_of(mask))
    dtype = weights.dtype
    inside = (weights >= jnp.asarray(low, dtype)) & (weights <= jnp.asarray(high, dtype))
    return jax.lax.stop_gradient(jnp.where(inside, weights, jnp.zeros((), dtype)))

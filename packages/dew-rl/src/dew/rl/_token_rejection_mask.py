"""Token-level rejection of rollout tokens whose k1 divergence leaves a band."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    is_python_number,
    require_float,
    require_positive_band,
    require_same_dtype,
    require_same_shape,
)
from dew.rl._masking import clamp, keep_of, select
from dew.rl._token_log_ratio import LOG_RATIO_BOUND


def rejection_k1(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, keep: jax.Array
) -> jax.Array:
    """verl's ``token_k1 = -clamp(old - behavior, +-20)``, 0 outside ``keep``."""
    log_ratio = select(old_log_probs - behavior_log_probs, keep)
    return -clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def log_band(low: float, high: float) -> tuple[float, float]:
    """Validate a ratio band and return its natural logs, as verl takes them."""
    for name, value in (("low", low), ("high", high)):
        if not is_python_number(value):
            raise TypeError(f"{name}: expected a Python number (a static bound), got {value!r}")
    require_positive_band(low, high)
    return math.log(low), math.log(high)


def token_rejection_mask(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    low: float,
    high: float,
) -> jax.Array:
    """``mask`` with the tokens whose k1 statistic falls outside ``[log low, log high]`` dropped.

    Port of verl 0.9.1 ``compute_rollout_rejection_mask`` with ``rollout_rs="token_k1"``
    and threshold ``"low_high"``. verl's statistic is
    ``k1 = -clamp(old - behavior, -20, 20) = log(behavior / old)``, and a token is kept
    when ``log(low) <= k1 <= log(high)``, i.e. when ``behavior / old`` lies in
    ``[low, high]``. The bounds are ratio bounds (positive, ``low <= high``) and their logs
    are taken in Python double precision, as verl does.

    Args:
      old_log_probs: ``[B, T]`` trainer-side log-probabilities of the sampled tokens.
      behavior_log_probs: ``[B, T]`` engine-side log-probabilities, same dtype.
      mask: ``[B, T]`` response mask; non-zero keeps a position.
      low: lower ratio bound.
      high: upper ratio bound.

    Returns:
      ``[B, T]`` in ``mask``'s dtype: ``mask`` where the token passes, 0 where it is
      rejected (verl's modified ``response_mask``). Carries no gradient.
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    log_low, log_high = log_band(low, high)
    mask = jnp.asarray(mask)
    k1 = rejection_k1(old_log_probs, behavior_log_probs, keep_of(mask))
    passed = (k1 >= log_low) & (k1 <= log_high)
    return jax.lax.stop_gradient(jnp.where(passed, mask, jnp.zeros((), mask.dtype)))

"""Sequence-level rejection of rollouts whose summed or mean k1 leaves a band."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._chains import broadcast_back, sequence_totals, token_keep
from dew.rl._checks import (
    require_float,
    require_rank,
    require_same_dtype,
    require_same_shape,
    require_segments,
)
from dew.rl._masking import count_dtype_for, divide, eps_denominator, keep_of, select
from dew.rl._token_rejection_mask import log_band, rejection_k1


def sequence_rejection_mask(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    low: float,
    high: float,
    mean: bool = False,
    segments: jax.Array | None = None,
) -> jax.Array:
    """``mask`` with whole sequences dropped when their k1 statistic leaves a band.

    Port of verl 0.9.1 ``compute_rollout_rejection_mask`` with ``rollout_rs="seq_sum_k1"``
    (``mean=False``, the default) or ``"seq_mean_k1"`` (``mean=True``), threshold
    ``"low_high"``. Per token ``k1 = -clamp(old - behavior, -20, 20)``; per sequence the
    statistic is the masked sum of ``k1``, or with ``mean=True`` its masked mean (count +
    1e-8 as in :func:`masked_mean`). A sequence is kept when
    ``log(low) <= statistic <= log(high)``, and all its tokens share the verdict.

    A sequence is a row, or with ``segments`` a chain of a packed row (see
    :func:`segment_mean`); positions with ``segments == 0`` are padding and come back 0.

    Args:
      old_log_probs: ``[B, T]`` trainer-side log-probabilities of the sampled tokens.
      behavior_log_probs: ``[B, T]`` engine-side log-probabilities, same dtype.
      mask: ``[B, T]`` response mask; non-zero keeps a position.
      low: lower ratio bound (> 0).
      high: upper ratio bound (>= low).
      mean: False for the summed statistic (``seq_sum_k1``), True for the mean
        (``seq_mean_k1``). Static under ``jax.jit``.
      segments: optional ``[B, T]`` integer chain ids, 0 = padding.

    Returns:
      ``[B, T]`` in ``mask``'s dtype, without gradient.
    """
    require_float("old_log_probs", old_log_probs)
    require_rank("old_log_probs", old_log_probs, 2, "[B, T]")
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    if segments is not None:
        require_segments(segments, "old_log_probs", old_log_probs)
    log_low, log_high = log_band(low, high)
    mask = jnp.asarray(mask)
    keep = token_keep(keep_of(mask), segments)
    k1 = select(rejection_k1(old_log_probs, behavior_log_probs, keep), keep)
    statistic, index = sequence_totals(k1, segments)
    if mean:
        counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
        statistic = divide(statistic, eps_denominator(counts, mask), k1.dtype)
    passed = (statistic >= log_low) & (statistic <= log_high)
    passed = jnp.broadcast_to(broadcast_back(passed, index), mask.shape) & (
        keep if segments is not None else jnp.ones(mask.shape, jnp.bool_)
    )
    return jax.lax.stop_gradient(jnp.where(passed, mask, jnp.zeros((), mask.dtype)))

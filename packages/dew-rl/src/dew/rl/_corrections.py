"""Rollout corrections: importance weights and rejection masks against the behaviour policy.

The rollout engine samples with its own numerics (the behaviour policy); the trainer
recomputes the log-probabilities of the same tokens (``old_log_probs``). These functions
weight or drop tokens and sequences whose two likelihoods disagree.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    is_python_number,
    require_float,
    require_positive_band,
    require_rank,
    require_same_dtype,
    require_same_shape,
    require_segments,
)
from dew.rl._masking import (
    LOG_RATIO_BOUND,
    broadcast_back,
    clamp,
    count_dtype_for,
    divide,
    eps_denominator,
    keep_of,
    select,
    sequence_totals,
    token_keep,
)


def behavior_importance_weights(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    cap: float,
) -> jax.Array:
    """Detached per-token TIS weights ``min(exp(old - behavior), cap)``, zero on padding.

    Port of verl 0.9.1 ``compute_rollout_correction_weights`` with ``rollout_is="token"``
    and a single float threshold (truncated importance sampling), fed the log ratio
    ``old_log_probs - behavior_log_probs`` as ``compute_rollout_correction_and_rejection_
    mask`` builds it. ``old_log_probs`` are the trainer's recomputed log-probabilities of
    the sampled tokens and ``behavior_log_probs`` the ones the rollout engine reported.
    The log ratio is clamped to +-20, exponentiated, zeroed outside the mask and capped
    from above. No batch normalisation and no rejection is applied; multiply the policy
    terms by the result before reducing them.

    Truncated per-token weights correct the per-token mismatch only; they do not turn the
    batch into an unbiased estimate of the full-trajectory expectation under the trainer's
    policy, and neither does filtering (:func:`token_rejection_mask`).

    Args:
      old_log_probs: ``[B, T]`` trainer-side log-probabilities of the sampled tokens.
      behavior_log_probs: ``[B, T]`` engine-side log-probabilities, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      cap: upper bound on a weight (verl's ``rollout_is_threshold``), positive.

    Returns:
      ``[B, T]`` weights in the inputs' dtype, without gradient; 0 outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import dew.rl as rl
      >>> old_log_probs = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
      >>> behavior_log_probs = jnp.log(jnp.array([[0.5, 0.25, 0.05]]))  # ratios 1, 2, 10
      >>> mask = jnp.array([[1, 1, 1]])
      >>> weights = rl.behavior_importance_weights(old_log_probs, behavior_log_probs, mask, 2.0)
      >>> print(np.asarray(weights).round(4))  # 10 is capped at 2
      [[1. 2. 2.]]

    References:
      Yao et al., `Your Efficient RL Framework Secretly Brings You Off-Policy RL Training
      <https://fengyao.notion.site/off-policy-rl>`_, 2025 (truncated importance sampling).

      verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py``,
      ``compute_rollout_correction_weights`` and
      ``compute_rollout_correction_and_rejection_mask``.
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    if is_python_number(cap) and cap <= 0:
        raise ValueError(f"cap: expected a positive weight bound, got {cap}")
    weights = _raw_weights(old_log_probs, behavior_log_probs, keep_of(mask))
    return jax.lax.stop_gradient(clamp(weights, high=cap))


def _raw_weights(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, keep: jax.Array
) -> jax.Array:
    """``exp(clamp(old - behavior, +-20))`` where kept, 0 elsewhere (shared by IcePop)."""
    log_ratio = select(old_log_probs - behavior_log_probs, keep)
    return select(jnp.exp(clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)), keep)


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

    Examples:
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import dew.rl as rl
      >>> old_log_probs = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
      >>> behavior_log_probs = jnp.log(jnp.array([[0.5, 0.25, 0.05]]))  # ratios 1, 2, 10
      >>> mask = jnp.array([[1, 1, 1]])
      >>> weights = rl.icepop_weights(old_log_probs, behavior_log_probs, mask, 0.5, 5.0)
      >>> print(np.asarray(weights).round(4))  # 10 leaves the band and is zeroed
      [[1. 2. 0.]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py``,
      ``compute_rollout_correction_weights`` (a ``"low_high"`` threshold).
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    require_positive_band(low, high)
    weights = _raw_weights(old_log_probs, behavior_log_probs, keep_of(mask))
    dtype = weights.dtype
    inside = (weights >= jnp.asarray(low, dtype)) & (weights <= jnp.asarray(high, dtype))
    return jax.lax.stop_gradient(jnp.where(inside, weights, jnp.zeros((), dtype)))


def _rejection_k1(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, keep: jax.Array
) -> jax.Array:
    """verl's ``token_k1 = -clamp(old - behavior, +-20)``, 0 outside ``keep``."""
    log_ratio = select(old_log_probs - behavior_log_probs, keep)
    return -clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _log_band(low: float, high: float) -> tuple[float, float]:
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

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> old_log_probs = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
      >>> behavior_log_probs = jnp.log(jnp.array([[0.5, 0.25, 0.05]]))  # behavior/old: 1, .5, .1
      >>> mask = jnp.array([[1, 1, 1]])
      >>> print(rl.token_rejection_mask(
      ...     old_log_probs, behavior_log_probs, mask, low=0.4, high=2.0))
      [[1 1 0]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py``,
      ``compute_rollout_rejection_mask`` (``rollout_rs="token_k1"``).
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    log_low, log_high = _log_band(low, high)
    mask = jnp.asarray(mask)
    k1 = _rejection_k1(old_log_probs, behavior_log_probs, keep_of(mask))
    passed = (k1 >= log_low) & (k1 <= log_high)
    return jax.lax.stop_gradient(jnp.where(passed, mask, jnp.zeros((), mask.dtype)))


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

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> old_log_probs = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
      >>> behavior_log_probs = jnp.log(jnp.array([[0.5, 0.4], [0.1, 0.5]]))
      >>> mask = jnp.array([[1, 1], [1, 1]])
      >>> print(rl.sequence_rejection_mask(  # the second row's summed k1 is log 0.2
      ...     old_log_probs, behavior_log_probs, mask, low=0.5, high=2.0))
      [[1 1]
       [0 0]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py``,
      ``compute_rollout_rejection_mask`` (``rollout_rs="seq_sum_k1"`` or
      ``"seq_mean_k1"``).
    """
    require_float("old_log_probs", old_log_probs)
    require_rank("old_log_probs", old_log_probs, 2, "[B, T]")
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    if segments is not None:
        require_segments(segments, "old_log_probs", old_log_probs)
    log_low, log_high = _log_band(low, high)
    mask = jnp.asarray(mask)
    keep = token_keep(keep_of(mask), segments)
    k1 = select(_rejection_k1(old_log_probs, behavior_log_probs, keep), keep)
    statistic, index = sequence_totals(k1, segments)
    if mean:
        counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
        statistic = divide(statistic, eps_denominator(counts, mask), k1.dtype)
    passed = (statistic >= log_low) & (statistic <= log_high)
    passed = jnp.broadcast_to(broadcast_back(passed, index), mask.shape) & (
        keep if segments is not None else jnp.ones(mask.shape, jnp.bool_)
    )
    return jax.lax.stop_gradient(jnp.where(passed, mask, jnp.zeros((), mask.dtype)))

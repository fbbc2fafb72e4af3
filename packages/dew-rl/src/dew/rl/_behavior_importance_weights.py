"""Truncated token importance weights against the behaviour (rollout-engine) policy."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import is_python_number, require_float, require_same_dtype, require_same_shape
from dew.rl._masking import clamp, keep_of, select
from dew.rl._token_log_ratio import LOG_RATIO_BOUND


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
    """
    require_float("old_log_probs", old_log_probs)
    require_same_shape("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_dtype("behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    require_same_shape("mask", mask, "old_log_probs", old_log_probs)
    if is_python_number(cap) and cap <= 0:
        raise ValueError(f"cap: expected a positive weight bound, got {cap}")
    weights = raw_weights(old_log_probs, behavior_log_probs, keep_of(mask))
    return jax.lax.stop_gradient(clamp(weights, high=cap))


def raw_weights(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, keep: jax.Array
) -> jax.Array:
    """``exp(clamp(old - behavior, +-20))`` where kept, 0 elsewhere (shared by IcePop)."""
    log_ratio = select(old_log_probs - behavior_log_probs, keep)
    return select(jnp.exp(clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)), keep)

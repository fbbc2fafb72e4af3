"""Per-token dual-clipped PPO policy terms (before reduction)."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    is_python_number,
    require_float,
    require_same_dtype,
    require_same_shape,
)
from dew.rl._masked_mean import masked_mean
from dew.rl._masking import clamp, keep_of, select


def clipped_surrogate_terms(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped policy loss per token, before any reduction, and verl's metrics.

    Port of verl 0.9.1 ``compute_policy_loss_vanilla`` up to its ``agg_loss`` call. With
    ``r = exp(log_ratio)`` and ``A`` the advantages, each kept token's loss is
    ``max(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))``; with ``dual_clip = c``
    the tokens with ``A < 0`` are further capped at ``-A c`` (arXiv:1912.09729).
    ``dual_clip=None`` drops that cap, which is GSPO's (and verl
    ``compute_policy_loss_gspo``'s) form.

    ``log_ratio`` is exponentiated as given: pass :func:`token_log_ratio` (clamped to
    +-20) for PPO/GRPO or :func:`sequence_log_ratio` (clamped at 10) for GSPO. Ties between
    the branches share the gradient evenly, as ``torch.maximum`` does.

    Positions outside the mask are replaced before any arithmetic (the double-``where``),
    so a nan there reaches neither the terms, the metrics nor any gradient; their terms
    are 0.

    Args:
      log_ratio: ``[B, T]`` log importance ratios.
      advantages: ``[B, T]`` advantages (rollout data), same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      epsilon_low: lower clip range, the ratio is clipped at ``1 - epsilon_low``.
      epsilon_high: upper clip range, the ratio is clipped at ``1 + epsilon_high``.
      dual_clip: verl's ``clip_ratio_c``; must be above 1. None disables the dual clip.

    Returns:
      ``(terms, metrics)``: ``terms`` is ``[B, T]`` in the inputs' dtype; ``metrics`` holds
      scalars without gradient: ``pg_clipfrac`` (share of kept tokens where the clipped
      branch is larger), ``pg_clipfrac_lower`` (share where the dual clip binds, 0 when
      disabled) in float32 as verl's ``.float()`` makes them, and ``ppo_kl``
      (``masked_mean(-log_ratio, mask)``).
    """
    require_float("log_ratio", log_ratio)
    require_same_shape("advantages", advantages, "log_ratio", log_ratio)
    require_same_dtype("advantages", advantages, "log_ratio", log_ratio)
    require_same_shape("mask", mask, "log_ratio", log_ratio)
    if dual_clip is not None and is_python_number(dual_clip) and dual_clip <= 1.0:
        raise ValueError(f"dual_clip: expected a value above 1.0 or None, got {dual_clip}")
    keep = keep_of(mask)
    log_ratio = select(log_ratio, keep)
    advantages = select(advantages, keep)

    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    terms = jnp.maximum(unclipped, clipped)
    clipfrac = masked_mean((clipped > unclipped).astype(jnp.float32), mask)

    if dual_clip is None:
        clipfrac_lower = jnp.zeros((), jnp.float32)
    else:
        capped = -advantages * jnp.asarray(dual_clip, log_ratio.dtype)
        negative = advantages < 0
        clipfrac_lower = masked_mean(((terms > capped) & negative).astype(jnp.float32), mask)
        terms = jnp.where(negative, jnp.minimum(capped, terms), terms)

    metrics = {
        "pg_clipfrac": clipfrac,
        "pg_clipfrac_lower": clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    metrics = jax.lax.stop_gradient(metrics)
    return select(terms, keep), metrics

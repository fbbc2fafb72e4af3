"""Token-mean dual-clipped PPO policy loss."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax

from dew.rl._clipped_surrogate_terms import clipped_surrogate_terms
from dew.rl._token_mean import token_mean


def clipped_surrogate(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The dual-clipped PPO policy loss, averaged over the kept tokens.

    Port of verl 0.9.1 ``compute_policy_loss_vanilla`` with ``loss_agg_mode="token-mean"``
    on one data-parallel rank: :func:`clipped_surrogate_terms` reduced by
    :func:`token_mean`. With ``dual_clip=None`` and :func:`sequence_log_ratio` as
    ``log_ratio`` it is verl's ``compute_policy_loss_gspo`` (token-mean)::

        lr = sequence_log_ratio(log_probs, old_log_probs, mask)
        loss, metrics = clipped_surrogate(lr, advantages, mask, 3e-4, 4e-4, dual_clip=None)

    For another reduction, take the terms and use :func:`sequence_mean`,
    :func:`sequence_sum_mean` or :func:`sequence_sum_norm`.

    Args:
      log_ratio: ``[B, T]`` log ratios (:func:`token_log_ratio` or
        :func:`sequence_log_ratio`).
      advantages: ``[B, T]`` advantages, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      epsilon_low: lower clip range (ratio floor ``1 - epsilon_low``).
      epsilon_high: upper clip range (ratio ceiling ``1 + epsilon_high``).
      dual_clip: verl's ``clip_ratio_c`` (> 1), or None for no dual clip.

    Returns:
      ``(loss, metrics)``: the scalar loss in the inputs' dtype (nan when the mask keeps
      nothing) and the metrics of :func:`clipped_surrogate_terms` (``pg_clipfrac``,
      ``pg_clipfrac_lower``, ``ppo_kl``).
    """
    terms, metrics = clipped_surrogate_terms(
        log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
    )
    return token_mean(terms, mask), metrics

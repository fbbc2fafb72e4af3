"""Per-token log importance ratio."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax

from dew.rl._checks import require_float, require_same_dtype, require_same_shape
from dew.rl._masking import clamp

#: verl clamps log ratios to this magnitude before exponentiating them.
LOG_RATIO_BOUND = 20.0


def token_log_ratio(log_probs: jax.Array, old_log_probs: jax.Array) -> jax.Array:
    """``log pi(a) - log pi_old(a)`` per token, clamped to [-20, 20].

    verl 0.9.1 ``compute_policy_loss_vanilla`` computes this as ``negative_approx_kl``
    before exponentiating it into the PPO ratio, and reports ``ppo_kl`` as its negated
    masked mean (:func:`clipped_surrogate` returns that metric). The clamp bounds the ratio
    by exp(20); its gradient is one at and inside the bounds and zero beyond, like
    ``torch.clamp``.

    Args:
      log_probs: ``[B, T]`` log-probabilities of the taken tokens under the live policy.
      old_log_probs: ``[B, T]`` the same under the policy that sampled them, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype. No mask is taken: a nan in an input stays at its
      own position, for the consumer's mask to drop.
    """
    require_float("log_probs", log_probs)
    require_same_shape("old_log_probs", old_log_probs, "log_probs", log_probs)
    require_same_dtype("old_log_probs", old_log_probs, "log_probs", log_probs)
    return clamp(log_probs - old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)

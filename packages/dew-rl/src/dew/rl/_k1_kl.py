"""k1 KL estimator."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax

from dew.rl._checks import require_float, require_same_dtype, require_same_shape


def k1_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """The naive estimator ``log pi - log pi_ref`` of KL(pi || pi_ref), per token.

    Port of verl 0.9.1 ``kl_penalty_forward(..., "k1")`` (also spelled ``"kl"``). Unbiased
    but high variance and negative for some tokens (http://joschu.net/blog/kl-approx.html).
    No clamp.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]``; aggregate with :func:`token_mean` or the sequence reductions.
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    return log_probs - ref_log_probs

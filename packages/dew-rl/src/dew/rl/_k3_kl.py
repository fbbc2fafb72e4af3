"""k3 KL estimator, clamped as verl clamps it."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_dtype, require_same_shape
from dew.rl._masking import clamp

#: Bound on ``log pi_ref - log pi`` before the exponential.
K3_LOG_RATIO_BOUND = 20.0
#: Bound on the estimate itself.
K3_ESTIMATE_BOUND = 10.0


def k3_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(pi || pi_ref) per token: ``exp(d) - d - 1``.

    ``d = log pi_ref - log pi``. The estimate is non-negative, unbiased for the sampled
    tokens and has lower variance than ``-d`` (http://joschu.net/blog/kl-approx.html).
    Port of verl 0.9.1 ``kl_penalty_forward(..., "k3")`` (``"low_var_kl"``): ``d`` is
    clamped to [-20, 20] before the exponential and the estimate to [-10, 10] after it, so
    one drifted token adds at most 10 rather than exp(20). Both clamps pass gradient at and
    inside their bounds, none beyond (torch's rule).

    For a KL loss, aggregate like the policy loss, ``beta * token_mean(k3_kl(...), mask)``.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype. No mask is taken: a nan input stays at its own
      position (and, since exp is non-linear, in its own gradient): select such entries
      away with ``jnp.where`` before calling when padding may hold garbage.
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    d = clamp(ref_log_probs - log_probs, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    estimate = jnp.exp(d) - d - 1
    return clamp(estimate, -K3_ESTIMATE_BOUND, K3_ESTIMATE_BOUND)

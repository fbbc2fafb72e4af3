"""k2 KL estimator."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_dtype, require_same_shape


def k2_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """Half the squared log ratio, ``0.5 * (log pi - log pi_ref)**2``, per token.

    Port of verl 0.9.1 ``kl_penalty_forward(..., "k2")`` (also spelled ``"mse"``).
    Non-negative and biased, but its gradient is the gradient of the true KL in
    expectation, which is why verl's ``"k3+"`` straight-through mode borrows it. No clamp.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype.
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    return 0.5 * jnp.square(log_probs - ref_log_probs)

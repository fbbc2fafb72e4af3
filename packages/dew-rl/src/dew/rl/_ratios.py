"""Log importance ratios between the live and the sampling policy: per token and GSPO's."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax

from dew.rl._checks import (
    require_float,
    require_rank,
    require_same_dtype,
    require_same_shape,
    require_segments,
)
from dew.rl._masking import LOG_RATIO_BOUND, clamp, keep_of, pooled_mean, select

#: verl clamps the sequence log ratio from above at this value before exponentiating it.
SEQUENCE_LOG_RATIO_MAX = 10.0


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

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0, -30.0]])
      >>> old_log_probs = jnp.array([[-1.5, -2.0, -1.0]])
      >>> print(rl.token_log_ratio(log_probs, old_log_probs))  # -29 is clamped to -20
      [[  0.5   0.  -20. ]]

    References:
      Schulman et al., `Proximal Policy Optimization Algorithms
      <https://arxiv.org/abs/1707.06347>`_, 2017.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``
      (``negative_approx_kl``).
    """
    require_float("log_probs", log_probs)
    require_same_shape("old_log_probs", old_log_probs, "log_probs", log_probs)
    require_same_dtype("old_log_probs", old_log_probs, "log_probs", log_probs)
    return clamp(log_probs - old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def sequence_log_ratio(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
) -> jax.Array:
    """GSPO's sequence log ratio, valued per sequence and differentiated per token.

    The GSPO ratio of a sequence is the geometric mean of its token ratios
    (arXiv:2507.18071, eq. 6), so its log is the masked mean ``m`` of the raw token log
    ratios. Port of verl 0.9.1 ``compute_policy_loss_gspo``: every token gets
    ``log_probs - sg(log_probs) + sg(m)``, clamped from above at 10. The value is ``m`` at
    each token of a sequence; the gradient of token ``t``'s entry is one with respect to
    token ``t``'s own log-probability and zero for every other token. Removing either stop
    gradient keeps the values and breaks the gradients.

    As verl does, the raw differences are pooled (no +-20 clamp per token first, unlike
    Tunix), the divisor is the kept count floored at one, and only the upper clamp at 10 is
    applied. A sequence is a row, or a chain of a packed row when ``segments`` is given
    (see :func:`segment_mean`); padding positions (``segments == 0``) get 0.

    GSPO loss: pass the result to :func:`clipped_surrogate` with ``dual_clip=None``::

        log_ratio = sequence_log_ratio(log_probs, old_log_probs, mask)
        loss, metrics = clipped_surrogate(log_ratio, advantages, mask, 3e-4, 4e-4, None)

    which equals verl's ``compute_policy_loss_gspo`` with ``loss_agg_mode="token-mean"``
    (its default in verl 0.9.1 configs). For the paper's sequence-level averaging use
    ``sequence_mean(clipped_surrogate_terms(...)[0], mask)``, verl's
    ``seq-mean-token-mean``. The ``ppo_kl`` metric then averages the sequence log ratio
    over tokens, which equals verl's token average of the raw differences unless a
    sequence hits the clamp.

    Args:
      log_probs: ``[B, T]`` live log-probabilities of the taken tokens.
      old_log_probs: ``[B, T]`` sampling-time log-probabilities, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: optional ``[B, T]`` integer chain ids, 0 = padding.

    Returns:
      ``[B, T]`` in the inputs' dtype. Masked positions carry their sequence's value, with
      zero gradient; a nan or inf there reaches neither values nor gradients.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0, -3.0, 0.0]])
      >>> old_log_probs = jnp.array([[-1.25, -2.5, -3.0, jnp.nan]])
      >>> mask = jnp.array([[1, 1, 1, 0]])  # the nan is padding
      >>> print(rl.sequence_log_ratio(log_probs, old_log_probs, mask))  # (0.25 + 0.5 + 0) / 3
      [[0.25 0.25 0.25 0.25]]

    References:
      Zheng et al., `Group Sequence Policy Optimization
      <https://arxiv.org/abs/2507.18071>`_, 2025.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_gspo``.
    """
    require_float("log_probs", log_probs)
    require_rank("log_probs", log_probs, 2, "[B, T]")
    require_same_shape("old_log_probs", old_log_probs, "log_probs", log_probs)
    require_same_dtype("old_log_probs", old_log_probs, "log_probs", log_probs)
    require_same_shape("mask", mask, "log_probs", log_probs)
    if segments is not None:
        require_segments(segments, "log_probs", log_probs)
    keep = keep_of(mask)
    safe_log_probs = select(log_probs, keep)
    difference = select(log_probs - old_log_probs, keep)
    pooled = jax.lax.stop_gradient(pooled_mean(difference, keep, segments))
    live = safe_log_probs - jax.lax.stop_gradient(safe_log_probs)
    return clamp(live + pooled, high=SEQUENCE_LOG_RATIO_MAX)

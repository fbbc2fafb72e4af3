"""GSPO's sequence-level log ratio with a per-token gradient."""

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
from dew.rl._masking import clamp, keep_of, select
from dew.rl._segment_mean import pooled_mean

#: verl clamps the sequence log ratio from above at this value before exponentiating it.
SEQUENCE_LOG_RATIO_MAX = 10.0


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

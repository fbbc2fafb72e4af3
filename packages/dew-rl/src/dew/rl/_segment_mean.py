"""Per-chain masked mean for packed rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._chains import broadcast_back, sequence_totals, token_keep
from dew.rl._checks import require_float, require_rank, require_same_shape, require_segments
from dew.rl._masking import count_dtype_for, divide, keep_of, select


def segment_mean(x: jax.Array, mask: jax.Array, segments: jax.Array) -> jax.Array:
    """Each token gets the masked mean of ``x`` over its own chain.

    A packed row holds several sequences ("chains") side by side; ``segments`` gives each
    token its chain id, 0 for padding. A chain is a maximal run of one non-zero id along a
    row (ids only mark boundaries, so row-local or batch-global numbering both work).

    The divisor is the chain's kept count floored at one, the pooling verl 0.9.1
    ``compute_policy_loss_gspo`` applies per row (``mask.sum(-1).clamp(min=1)``), so a
    chain with no kept token, and every padding position, gets 0. With one chain per row
    this equals that per-row pooling exactly.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: ``[B, T]`` integer chain ids, 0 = padding.

    Returns:
      ``[B, T]`` in ``x``'s dtype; positions outside the mask carry their chain's value.
    """
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    require_segments(segments, "x", x)
    return pooled_mean(x, keep_of(mask), segments)


def pooled_mean(x: jax.Array, keep: jax.Array, segments: jax.Array | None) -> jax.Array:
    """``[B, T]`` per-sequence masked mean (divisor floored at 1), broadcast to tokens."""
    keep = token_keep(keep, segments)
    totals, index = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    per_sequence = divide(totals, jnp.maximum(counts, 1), x.dtype)
    return jnp.broadcast_to(broadcast_back(per_sequence, index), x.shape)

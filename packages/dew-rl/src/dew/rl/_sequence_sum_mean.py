"""Sequence-mean of token-sums (verl ``seq-mean-token-sum``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._chains import sequence_totals, token_keep
from dew.rl._checks import require_float, require_rank, require_same_shape, require_segments
from dew.rl._masking import at_least_float32, count_dtype_for, count_kept, keep_of, select


def sequence_sum_mean(
    x: jax.Array, mask: jax.Array, segments: jax.Array | None = None
) -> jax.Array:
    """Average over sequences of each sequence's masked sum.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-sum")`` (one data-parallel
    rank): per-sequence sums of the kept positions, averaged over the sequences that keep
    at least one token. No kept token anywhere gives 0/0 = nan.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: optional ``[B, T]`` integer chain ids (0 = padding); each chain is then a
        sequence (see :func:`segment_mean`).

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).
    """
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    if segments is not None:
        require_segments(segments, "x", x)
    return summed_sequences(x, keep_of(mask), segments)


def summed_sequences(x: jax.Array, keep: jax.Array, segments: jax.Array | None) -> jax.Array:
    """Mean over non-empty sequences of their masked sums, in at least float32."""
    keep = token_keep(keep, segments)
    totals, _ = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    present = counts > 0
    totals = totals.astype(at_least_float32(x.dtype))
    return jnp.sum(select(totals, present)) / count_kept(present).astype(totals.dtype)

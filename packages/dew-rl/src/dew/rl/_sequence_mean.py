"""Sequence-mean of token-means (verl ``seq-mean-token-mean``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._chains import sequence_totals, token_keep
from dew.rl._checks import require_float, require_rank, require_same_shape, require_segments
from dew.rl._masking import (
    at_least_float32,
    count_dtype_for,
    count_kept,
    divide,
    eps_denominator,
    keep_of,
    select,
)


def sequence_mean(x: jax.Array, mask: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """Average over sequences of each sequence's own token mean.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-mean")`` (one data-parallel
    rank): each sequence's masked sum is divided by its kept count + 1e-8 (added in float32
    for boolean/integer masks, as torch does), and those means are averaged over the
    sequences that keep at least one token. Sequences with nothing kept are left out of
    the average instead of counting as zero. No kept token anywhere gives 0/0 = nan.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: optional ``[B, T]`` integer chain ids (0 = padding) when rows are packed;
        then each chain is a sequence (see :func:`segment_mean`).

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).
    """
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    if segments is not None:
        require_segments(segments, "x", x)
    keep = token_keep(keep_of(mask), segments)
    totals, _ = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    wide = at_least_float32(x.dtype)
    per_sequence = divide(totals, eps_denominator(counts, mask), wide)
    present = counts > 0
    return divide(jnp.sum(select(per_sequence, present)), count_kept(present), wide)

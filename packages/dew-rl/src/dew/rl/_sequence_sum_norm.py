"""Sequence-mean of token-sums over a constant (verl ``seq-mean-token-sum-norm``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank, require_same_shape, require_segments
from dew.rl._masking import keep_of
from dew.rl._sequence_sum_mean import summed_sequences


def sequence_sum_norm(
    x: jax.Array,
    mask: jax.Array,
    norm: float | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """:func:`sequence_sum_mean` divided by a constant, Dr.GRPO's length-free reduction.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-sum-norm")`` (one
    data-parallel rank): the mean over non-empty sequences of their masked sums, divided by
    ``norm``. ``norm=None`` uses the row width ``T``, verl's default
    (``loss_scale_factor=None``). Pass a fixed number to keep the divisor constant when the
    padded width changes from batch to batch (arXiv:2503.20783).

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      norm: the constant divisor (a Python number or a scalar array), default ``T``.
      segments: optional ``[B, T]`` integer chain ids (0 = padding); each chain is then a
        sequence. The default divisor stays the row width ``T``.

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).
    """
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    if segments is not None:
        require_segments(segments, "x", x)
    if norm is None:
        norm = x.shape[-1]
    elif isinstance(norm, int | float) and norm <= 0:
        raise ValueError(f"norm: expected a positive divisor, got {norm}")
    loss = summed_sequences(x, keep_of(mask), segments)
    return loss / jnp.asarray(norm, dtype=loss.dtype)

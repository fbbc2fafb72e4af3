"""Mask, dtype, count and chain arithmetic shared by every dew.rl theme (private).

This module, :mod:`dew.rl._checks` and :mod:`dew.rl._token_terms` (the surrogate's and
k3's elementwise pieces, built on this module) are the foundations of ``dew.rl``: the
themed modules (``_gae``, ``_group``, ``_reductions``, ``_ratios``, ``_clipped_surrogate``,
``_cispo``, ``_value_loss``, ``_kl``, ``_entropy``, ``_corrections``, ``_preference``,
``_policy_loss``) import from these only, never from each other. What two themes both need
lives here.

A mask is a boolean or numeric array; a non-zero entry keeps its position. Values at
positions a mask drops are replaced through ``jnp.where`` before any arithmetic touches
them, so a nan or inf sitting in padding reaches neither a result nor a gradient.

The denominators reproduce how torch types verl's ``mask.sum() + 1e-8`` (verl 0.9.1,
``verl.utils.torch_functional.masked_mean``): an integer or boolean mask sums to int64 and
adding the Python float gives torch's default float32, so the 1e-8 is added in float32
whatever the dtype of the values; a floating mask keeps its own dtype.

Chains: a sequence is a row of a ``[B, T]`` array, or, when ``segments`` is given, a chain
of a packed row. ``segments`` holds integer ids; 0 marks padding that belongs to no chain.
A chain is a maximal run of one non-zero id along a row: ids only mark where a chain
starts and ends, so row-local ids (1, 2, 3, ...) and batch-global ids both work. Two
chains that touch must carry different ids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: The constant verl adds to mask counts in ``masked_mean``.
COUNT_EPS = 1e-8
#: verl clamps token log ratios to this magnitude before exponentiating them.
LOG_RATIO_BOUND = 20.0


def keep_of(mask: jax.Array) -> jax.Array:
    """Boolean view of ``mask``: True where the position is kept."""
    mask = jnp.asarray(mask)
    if mask.dtype == jnp.bool_:
        return mask
    return mask != jnp.zeros((), mask.dtype)


def select(x: jax.Array, keep: jax.Array, fill: float = 0.0) -> jax.Array:
    """``x`` where ``keep``, else ``fill`` (in ``x``'s dtype)."""
    return jnp.where(keep, x, jnp.asarray(fill, dtype=x.dtype))


def count_dtype(mask: jax.Array) -> jnp.dtype:
    """The floating dtype torch gives ``mask.sum() + 1e-8`` for this mask."""
    dtype = jnp.result_type(mask)
    if jnp.issubdtype(dtype, jnp.floating):
        return dtype
    return jnp.dtype(jnp.float32)


def eps_denominator(count: jax.Array, mask: jax.Array) -> jax.Array:
    """verl's ``count + 1e-8``, added in the dtype torch gives it (see :func:`count_dtype`)."""
    cdtype = count_dtype(mask)
    return count.astype(cdtype) + jnp.asarray(COUNT_EPS, cdtype)


def wider(first: jnp.dtype, second: jnp.dtype) -> jnp.dtype:
    """The wider of two floating dtypes (torch's promotion of two 0-d floating tensors)."""
    first, second = jnp.dtype(first), jnp.dtype(second)
    return first if first.itemsize >= second.itemsize else second


def divide(numerator: jax.Array, denominator: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """``numerator / denominator`` rounded once into ``dtype``.

    torch divides a bfloat16 or float16 tensor in float32 and rounds the quotient, without
    first rounding a wider denominator (a count, say) to half precision; so does this.
    float32 and float64 divide in their own dtype.
    """
    wide = at_least_float32(dtype)
    return (numerator.astype(wide) / denominator.astype(wide)).astype(dtype)


def clamp(x: jax.Array, low: float | None = None, high: float | None = None) -> jax.Array:
    """``torch.clamp`` with its gradient: one at and inside the bounds, zero beyond.

    ``jnp.clip`` passes no gradient at a bound and ``jnp.minimum`` passes half at a tie, so
    the two selects here reproduce torch's inclusive gradient. A nan stays nan.
    """
    if low is not None:
        low_a = jnp.asarray(low, dtype=x.dtype)
        x = jnp.where(x < low_a, low_a, x)
    if high is not None:
        high_a = jnp.asarray(high, dtype=x.dtype)
        x = jnp.where(x > high_a, high_a, x)
    return x


def at_least_float32(dtype: jnp.dtype) -> jnp.dtype:
    """float32 for half-precision dtypes, the dtype itself for float32 and float64."""
    dtype = jnp.dtype(dtype)
    return dtype if dtype.itemsize >= 4 else jnp.dtype(jnp.float32)


#: float32 counts every integer exactly up to 2**24.
_EXACT_FLOAT32_COUNT = 2**24


def count_dtype_for(size: int) -> jnp.dtype:
    """float32 when every count of ``size`` items is exact in it, else int32.

    XLA on CPU vectorises float reductions but not integer ones, so counting in float32 is
    several times faster and, below 2**24 items, exactly as precise.
    """
    return jnp.dtype(jnp.float32) if size < _EXACT_FLOAT32_COUNT else jnp.dtype(jnp.int32)


#: Lane counts tried for the whole-array count; each partial count fits in uint8.
_COUNT_LANES = (16, 8, 4, 2)


def count_kept(keep: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
    """Exact number of kept positions along ``axis`` (float32 or int32, see above).

    For a whole-array float32 count the flat mask is cut into ``k`` equal slices that are
    added byte-wise (each partial is at most 16, exact in uint8) and only those partials
    are summed in float32: XLA on CPU then reads the one-byte mask once instead of writing
    and reading back a float32 copy of it. The result is the same exact count.
    """
    dtype = count_dtype_for(keep.size)
    if axis is None and dtype == jnp.float32 and keep.dtype == jnp.bool_:
        size = keep.size
        for lanes in _COUNT_LANES:
            if size % lanes == 0:
                slices = keep.reshape(lanes, size // lanes).astype(jnp.uint8)
                partial = jnp.sum(slices, axis=0, dtype=jnp.uint8)
                return jnp.sum(partial, dtype=dtype)
    return jnp.sum(keep, axis=axis, dtype=dtype)


def chain_index(segments: jax.Array) -> jax.Array:
    """``[B, T]`` int32 index of each token's chain among ``B * T`` slots."""
    batch, width = segments.shape
    starts = jnp.concatenate(
        [jnp.ones((batch, 1), jnp.bool_), segments[:, 1:] != segments[:, :-1]], axis=1
    )
    run = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1
    offsets = (jnp.arange(batch, dtype=jnp.int32) * width)[:, None]
    return run + offsets


def sequence_totals(
    values: jax.Array, segments: jax.Array | None
) -> tuple[jax.Array, jax.Array | None]:
    """Sum ``values`` ([B, T], already zero where not kept) per sequence.

    Returns the per-sequence totals (``[B]`` for rows, ``[B * T]`` slots for chains, empty
    slots holding 0) and the chain index (None for rows) to broadcast them back.
    """
    if segments is None:
        return jnp.sum(values, axis=-1), None
    index = chain_index(segments)
    totals = jax.ops.segment_sum(values.reshape(-1), index.reshape(-1), num_segments=values.size)
    return totals, index


def broadcast_back(per_sequence: jax.Array, index: jax.Array | None) -> jax.Array:
    """Give every token its sequence's value: ``[B] -> [B, 1]`` or gather from chain slots."""
    if index is None:
        return per_sequence[:, None]
    return per_sequence[index]


def token_keep(keep: jax.Array, segments: jax.Array | None) -> jax.Array:
    """Kept positions, with segment-0 padding dropped when segments are given."""
    if segments is None:
        return keep
    return keep & (segments != 0)


# Reductions two themes share (checked public forms live in ``_reductions``).


def mean_with_eps(
    x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None
) -> jax.Array:
    """verl's ``masked_mean``: kept sum over ``count + 1e-8``, typed as torch types it."""
    keep = keep_of(mask)
    total = jnp.sum(select(x, keep), axis=axis)
    count = count_kept(keep, axis=axis)
    return divide(total, eps_denominator(count, mask), wider(x.dtype, count_dtype(mask)))


def exact_mean(x: jax.Array, keep: jax.Array) -> jax.Array:
    """verl's ``token-mean``: kept sum over the exact kept count (nan when none)."""
    total = jnp.sum(select(x, keep))
    return divide(total, count_kept(keep), x.dtype)


def pooled_mean(x: jax.Array, keep: jax.Array, segments: jax.Array | None) -> jax.Array:
    """``[B, T]`` per-sequence masked mean (divisor floored at 1), broadcast to tokens."""
    keep = token_keep(keep, segments)
    totals, index = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    per_sequence = divide(totals, jnp.maximum(counts, 1), x.dtype)
    return jnp.broadcast_to(broadcast_back(per_sequence, index), x.shape)

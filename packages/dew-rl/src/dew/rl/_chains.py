"""Per-sequence totals for rows or for packed chains (private).

A sequence is a row of a ``[B, T]`` array, or, when ``segments`` is given, a chain of a
packed row. ``segments`` holds integer ids; 0 marks padding that belongs to no chain. A
chain is a maximal run of one non-zero id along a row: ids only mark where a chain starts
and ends, so row-local ids (1, 2, 3, ...) and batch-global ids both work. Two chains that
touch must carry different ids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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

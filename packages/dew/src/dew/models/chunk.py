"""Attention for a chunk of queries against a key/value cache (block diffusion with a cache).

A block-diffusion model reads the row block-causally: a block sees itself in full and
every block before it. Generating with a cache therefore runs each finished block once
(its keys and values go into the cache, like a prefill) and runs the denoising steps of
the current block over that block alone. `attend_chunk` is the attention of such a step:
`C` new queries per row sit at cache slots `lengths .. lengths + C - 1` and see

* the cached keys at slots `< lengths` (what came before the chunk), and
* the chunk's own `C` keys, all of them, in both directions,

with `config.sliding_window` W still hiding keys `W` or more slots away (slots are token
positions, so this is the row-index window of the whole-row pass). The cache itself is
not written here: `write_chunk` stores the chunk's keys and values at their slots when
the caller keeps them (`dew.models.decoder.CausalTransformer.extend` does both, layer by
layer, through `layer_chunk`). Slots `>= lengths` of the cache are never read, so they may hold
anything.

Scores are soft-maxed in float32 over the cache's `S` slots and the chunk's `C` keys
together; a hidden key gets `NEG_INF`, whose weight is exactly zero, so the result equals
the whole-row block-causal pass up to float32 summation order.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dew.models.layers import NEG_INF, visible


def chunk_masks(lengths: jax.Array, chunk: int, capacity: int, window: int | None) -> tuple:
    """`(old, own)`: which keys the chunk's queries see.

    lengths int32 `[B]`: filled slots per row (the chunk starts there). old bool
    `[B, C, S]`: cache slot `s` is seen when `s < lengths` (and inside the window);
    own bool `[C, C]`: chunk key `j` is seen by chunk query `i` when `|i - j| < W`
    (every one without a window).
    """
    slots = jnp.arange(capacity, dtype=jnp.int32)
    queries = lengths[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :]
    filled = slots[None, None, :] < lengths[:, None, None]
    old = filled & visible(queries[:, :, None], slots[None, None, :], window, causal=False)
    idx = jnp.arange(chunk)
    own = visible(idx[:, None], idx[None, :], window, causal=False)
    return old, own


def attend_chunk(
    attn: Any,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The chunk's attention output and its rotated keys and values.

    attn: a bound `dew.models.layers.Attention`; x `[B, C, D]`; cos, sin `[B, C, Dh]`
    (the tables of positions `lengths + 0 .. C-1`); key cache `[B, KVH, Dh, S]`, value
    cache `[B, KVH, S, Dh]` (`dew.models.decoder.KVCache`); lengths
    int32 `[B]`. Returns the output `[B, C, D]` and keys, values `[B, C, KVH, Dh]` in the
    cache dtype (not written into the cache).
    """
    cfg = attn.config
    b, c, _ = x.shape
    q, k, v = attn._project(x, cos, sin)
    k, v = k.astype(k_cache.dtype), v.astype(v_cache.dtype)
    own_k, own_v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    s = v_cache.shape[2]
    seen_old, seen_own = chunk_masks(lengths, c, s, cfg.sliding_window)
    old = jnp.where(seen_old[:, None, None], attn._scores(q, k_cache, slots_last=True), NEG_INF)
    own = jnp.where(seen_own, attn._scores(q, own_k), NEG_INF)
    probs = jax.nn.softmax(jnp.concatenate([old, own], axis=-1), axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs[..., :s], v_cache)
    out = out + jnp.einsum("bkgts,bksd->btkgd", probs[..., s:], own_v)
    return attn.o_proj(out.reshape(b, c, -1)), (k, v)


def layer_chunk(
    layer: Any,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One bound `DecoderLayer` over a chunk: `x + attn(norm(x))` with `attend_chunk`, then
    `x + mlp(norm(x))`, the same pre-norm block as the layer's own call. Returns the
    output `[B, C, D]` and the chunk's keys and values `[B, C, KVH, Dh]`."""
    attn, kv = attend_chunk(
        layer.self_attn, layer.input_layernorm(x), cos, sin, k_cache, v_cache, lengths
    )
    x = x + attn
    return x + layer.mlp(layer.post_attention_layernorm(x)), kv


def write_chunk(
    cache: jax.Array, new: jax.Array, lengths: jax.Array, slot_axis: int = 2
) -> jax.Array:
    """cache with `new` `[B, C, KVH, Dh]` at slots `lengths .. lengths + C - 1` of each
    row; slots past the capacity are dropped. slot_axis: 2 for a value cache
    `[B, KVH, S, Dh]`, 3 for a key cache `[B, KVH, Dh, S]` (either way the indexed
    update takes `new` in its `[B, C, KVH, Dh]` layout)."""
    b, c = new.shape[:2]
    rows = jnp.arange(b)[:, None]
    slots = lengths[:, None] + jnp.arange(c, dtype=lengths.dtype)[None, :]
    index = (rows,) + (slice(None),) * (slot_axis - 1) + (slots,)
    return cache.at[index].set(new.astype(cache.dtype), mode="drop")


__all__ = ["attend_chunk", "chunk_masks", "layer_chunk", "write_chunk"]

"""Blockwise masked attention whose memory grows with the sequence, not with its square.

`flash_attention` computes `softmax(mask ? q k^T / sqrt(Dh) : NEG_INF) v` one query chunk
at a time, walking that chunk's key span in blocks with a running maximum and a running
sum in float32 (the online softmax of Milakov and Gimelshein 2018; Dao 2023,
"FlashAttention-2", Algorithms 1 and 2). Its `jax.custom_vjp` keeps only the output and,
per query, that maximum and sum; the backward pass recomputes each block's
probabilities from them and accumulates the gradients of q, k and v block by block, so
neither pass holds a `[T, S]` array of scores or probabilities.

Both loops are `jax.lax.fori_loop`s (chunks outside, key blocks inside, their bounds read
from a table of spans), so the traced program is the same size at every length. The
backward pass is written out, so forward-mode differentiation (`jax.jvp`) does not apply.

Numerics match the dense masked softmax of `dew.models.layers`: scores and the softmax in
float32, the probabilities cast to the values' dtype before they meet the values. A
query whose mask hides every key of its span gets what that dense softmax gives it, the
mean of the span's values, and no gradient reaches its q or the keys through the scores.
Keys outside a chunk's span are never read into the result (they weigh exactly zero).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# A hidden (masked) score: the same fill as dew.models.layers.NEG_INF, kept here to avoid a cycle.
_HIDDEN = float(jnp.finfo(jnp.float32).min)
Spans = tuple[tuple[int, int], ...]


def flash_attention(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    spans: Spans,
    chunk: int,
    block: int,
) -> jax.Array:
    """Masked grouped-query attention: `[B, T, KVH, G, Dh]` in the values' dtype.

    q `[B, T, KVH, G, Dh]` (query heads grouped by their key/value head), keys and values
    `[B, KVH, S, Dh]`, mask bool `[B, T, S]` (query, key; True = visible). spans (static):
    one `(low, high)` per chunk of `chunk` queries, the keys `[low, high)` that chunk may
    see (`dew.models.layers.key_span`), non-empty; block (static): keys per inner step. T
    and S need not be multiples of chunk and block (padding is hidden). Differentiable in
    q, keys and values.
    """
    _check(q, keys, values, mask, spans, chunk, block)
    return _attention(q, keys, values, mask, spans, chunk, block)


def _check(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    spans: Spans,
    chunk: int,
    block: int,
) -> None:
    if q.ndim != 5:
        raise ValueError(f"q: expected [B, T, KVH, G, Dh], got shape {q.shape}")
    b, t, kvh, _, dh = q.shape
    if keys.shape[:2] != (b, kvh) or keys.shape[3] != dh or values.shape != keys.shape:
        raise ValueError(
            f"keys/values: expected [{b}, {kvh}, S, {dh}] each, got {keys.shape} and {values.shape}"
        )
    if mask.shape != (b, t, keys.shape[2]):
        raise ValueError(f"mask: expected shape {(b, t, keys.shape[2])}, got {mask.shape}")
    if chunk < 1 or block < 1:
        raise ValueError(f"chunk/block: expected positive ints, got {chunk} and {block}")
    if len(spans) != -(-t // chunk):
        raise ValueError(f"spans: expected {-(-t // chunk)} (one per chunk), got {len(spans)}")
    if any(not 0 <= low < high <= keys.shape[2] for low, high in spans):
        raise ValueError(f"spans: expected 0 <= low < high <= {keys.shape[2]}, got {spans}")


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _layout(
    q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, chunk: int, block: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """q as `[B, KVH, G, Tp, Dh]`, keys/values `[B, KVH, Sp, Dh]`, mask `[B, Tp, Sp]`, padded."""
    tp = -(-q.shape[1] // chunk) * chunk
    sp = -(-keys.shape[2] // block) * block
    qh = _pad_axis(q.transpose(0, 2, 3, 1, 4), 3, tp)
    mask = _pad_axis(_pad_axis(mask, 1, tp), 2, sp)
    return qh, _pad_axis(keys, 2, sp), _pad_axis(values, 2, sp), mask


def _tables(spans: Spans, block: int) -> tuple[jax.Array, ...]:
    """Per chunk: span low, span high, first key block, one past the last key block."""
    low = np.array([s[0] for s in spans], np.int32)
    high = np.array([s[1] for s in spans], np.int32)
    return tuple(jnp.asarray(a) for a in (low, high, low // block, -(-high // block)))


def _block_scores(
    qc: jax.Array, keys: jax.Array, mask: jax.Array, start: jax.Array, key_start: jax.Array,
    span: tuple[jax.Array, jax.Array], block: int,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Float32 scores `[B, KVH, G, C, K]` of a query chunk against one key block, and `keep`.

    Hidden keys score `_HIDDEN` (as in the dense softmax); keys outside the span score
    `-inf`, so they weigh zero even in a row whose every key is hidden. `keep` marks the
    visible keys, the only scores a gradient flows into.
    """
    b, _, _, c, dh = qc.shape
    kb = jax.lax.dynamic_slice_in_dim(keys, key_start, block, axis=2)
    scores = jnp.einsum("bkgcd,bksd->bkgcs", qc, kb, preferred_element_type=jnp.float32)
    scores = scores * (dh**-0.5)
    seen = jax.lax.dynamic_slice(mask, (0, start, key_start), (b, c, block))[:, None, None]
    index = key_start + jnp.arange(block)
    inside = (index >= span[0]) & (index < span[1])
    scores = jnp.where(inside, jnp.where(seen, scores, _HIDDEN), -jnp.inf)
    return scores, seen & inside


def _forward(
    q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
    spans: Spans, chunk: int, block: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """Padded-layout output `[B, KVH, G, Tp, Dh]`, row maxima and row sums `[B, KVH, G, Tp]`."""
    low, high, first, last = _tables(spans, block)
    b, kvh, g, tp, dh = q.shape
    stats = jnp.full((b, kvh, g, chunk), _HIDDEN, jnp.float32), jnp.zeros((b, kvh, g, chunk))

    def one_chunk(i: jax.Array, done: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        start = i * chunk
        qc = jax.lax.dynamic_slice_in_dim(q, start, chunk, axis=3)

        def one_block(j: jax.Array, run: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            top, total, acc = run
            key_start = j * block
            s, _ = _block_scores(qc, keys, mask, start, key_start, (low[i], high[i]), block)
            new_top = jnp.maximum(top, s.max(axis=-1))
            decay = jnp.exp(top - new_top)
            p = jnp.exp(s - new_top[..., None])
            vb = jax.lax.dynamic_slice_in_dim(values, key_start, block, axis=2)
            pv = jnp.einsum(
                "bkgcs,bksd->bkgcd", p.astype(values.dtype), vb, preferred_element_type=jnp.float32
            )
            return new_top, decay * total + p.sum(axis=-1), decay[..., None] * acc + pv

        init = (*stats, jnp.zeros((b, kvh, g, chunk, dh), jnp.float32))
        top, total, acc = jax.lax.fori_loop(first[i], last[i], one_block, init)
        out = (acc / total[..., None]).astype(values.dtype)
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(buf, part, start, axis=3)
            for buf, part in zip(done, (out, top, total), strict=True)
        )

    bufs = (
        jnp.zeros((b, kvh, g, tp, dh), values.dtype),
        jnp.zeros((b, kvh, g, tp), jnp.float32),
        jnp.ones((b, kvh, g, tp), jnp.float32),
    )
    out, top, total = jax.lax.fori_loop(0, tp // chunk, one_chunk, bufs)
    return out, top, total


def _backward(
    res: tuple[jax.Array, ...], grad: jax.Array, spans: Spans, chunk: int, block: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Float32 gradients of the padded q `[B, KVH, G, Tp, Dh]`, keys and values."""
    q, keys, values, mask, out, top, total = res
    low, high, first, last = _tables(spans, block)
    dh = q.shape[-1]
    # rowsum(dO * O): the softmax's own term, one float per query.
    delta = jnp.sum(grad.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

    def one_chunk(i: jax.Array, acc: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        dq, dk, dv = acc
        start = i * chunk
        qc, go = (jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=3) for x in (q, grad))
        tc, sc, dc = (
            jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=3)[..., None]
            for x in (top, total, delta)
        )

        def one_block(j: jax.Array, run: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            dqc, dk, dv = run
            key_start = j * block
            s, keep = _block_scores(qc, keys, mask, start, key_start, (low[i], high[i]), block)
            p = jnp.exp(s - tc) / sc
            kb, vb = (
                jax.lax.dynamic_slice_in_dim(x, key_start, block, axis=2) for x in (keys, values)
            )
            dv_b = jnp.einsum(
                "bkgcs,bkgcd->bksd", p.astype(grad.dtype), go, preferred_element_type=jnp.float32
            )
            dp = jnp.einsum("bkgcd,bksd->bkgcs", go, vb, preferred_element_type=jnp.float32)
            ds = jnp.where(keep, p * (dp - dc), 0.0) * (dh**-0.5)
            dqc = dqc + jnp.einsum("bkgcs,bksd->bkgcd", ds, kb.astype(jnp.float32))
            dk_b = jnp.einsum("bkgcs,bkgcd->bksd", ds, qc.astype(jnp.float32))
            return dqc, _add_at(dk, dk_b, key_start), _add_at(dv, dv_b, key_start)

        dqc, dk, dv = jax.lax.fori_loop(
            first[i], last[i], one_block, (jnp.zeros(qc.shape, jnp.float32), dk, dv)
        )
        return jax.lax.dynamic_update_slice_in_dim(dq, dqc, start, axis=3), dk, dv

    zeros = (jnp.zeros(q.shape, jnp.float32), *(jnp.zeros(keys.shape, jnp.float32),) * 2)
    dq, dk, dv = jax.lax.fori_loop(0, q.shape[3] // chunk, one_chunk, zeros)
    return dq, dk, dv


def _add_at(buf: jax.Array, part: jax.Array, start: jax.Array) -> jax.Array:
    """`buf[:, :, start:start + len(part)] += part` along the key axis."""
    old = jax.lax.dynamic_slice_in_dim(buf, start, part.shape[2], axis=2)
    return jax.lax.dynamic_update_slice_in_dim(buf, old + part, start, axis=2)


def _unlayout(x: jax.Array, t: int) -> jax.Array:
    """`[B, KVH, G, Tp, Dh]` back to `[B, T, KVH, G, Dh]`."""
    return x[:, :, :, :t].transpose(0, 3, 1, 2, 4)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(
    q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
    spans: Spans, chunk: int, block: int,
) -> jax.Array:  # fmt: skip
    return _attention_fwd(q, keys, values, mask, spans, chunk, block)[0]


def _attention_fwd(
    q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
    spans: Spans, chunk: int, block: int,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:  # fmt: skip
    qh, kp, vp, mp = _layout(q, keys, values, mask, chunk, block)
    out, top, total = _forward(qh, kp, vp, mp, spans, chunk, block)
    return _unlayout(out, q.shape[1]), (q, keys, values, mask, out, top, total)


def _attention_bwd(
    spans: Spans, chunk: int, block: int, res: tuple[jax.Array, ...], grad: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, None]:
    q, keys, values, mask, out, top, total = res
    qh, kp, vp, mp = _layout(q, keys, values, mask, chunk, block)
    go = _pad_axis(grad.transpose(0, 2, 3, 1, 4), 3, qh.shape[3])
    dq, dk, dv = _backward((qh, kp, vp, mp, out, top, total), go, spans, chunk, block)
    s = keys.shape[2]
    return (
        _unlayout(dq, q.shape[1]).astype(q.dtype),
        dk[:, :, :s].astype(keys.dtype),
        dv[:, :, :s].astype(values.dtype),
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)

"""`dew.models.flash.flash_attention` against the dense masked softmax it replaces.

The reference soft-maxes each query chunk over its whole key span in float32, with hidden
keys at `NEG_INF` (what `Attention.__call__` did before the blockwise pass), and is
differentiated by JAX; the blockwise pass must give the same output and the same
gradients of q, keys and values for every mask the decoder builds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.flash import flash_attention
from dew.models.layers import NEG_INF, block_causal, key_span, visible

B, T, KVH, G, DH = 2, 37, 2, 2, 8  # T is not a multiple of the chunk
CHUNK, BLOCK = 8, 16
TOL = 1e-5


def _reference(q, keys, values, mask, spans, chunk):
    b, t, kvh, g, dh = q.shape
    outputs = []
    for i, (low, high) in enumerate(spans):
        start, end = i * chunk, min(i * chunk + chunk, t)
        scores = jnp.einsum("btkgd,bksd->bkgts", q[:, start:end], keys[:, :, low:high])
        scores = scores * dh**-0.5
        seen = mask[:, None, None, start:end, low:high]
        probs = jax.nn.softmax(jnp.where(seen, scores, NEG_INF), axis=-1)
        outputs.append(jnp.einsum("bkgts,bksd->btkgd", probs, values[:, :, low:high]))
    return jnp.concatenate(outputs, axis=1)


def _mask(kind: str) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """A `[B, T, T]` mask of one kind and the spans `Attention.__call__` would use."""
    idx = np.arange(T)
    segments = np.ones((B, T), np.int32)
    segments[1, 20:] = 2  # row 1 packs two documents
    segments[1, 33:] = 0  # and ends in padding
    pos = np.where(segments[1] == 2, idx - 20, idx)
    positions = np.stack([idx, np.where(segments[1] == 0, 0, pos)])
    window, causal, size = None, True, None
    if kind == "window":
        window = 5
    if kind in ("bidirectional", "block"):
        causal = False
    if kind == "block":
        size = 4
    rule = np.array(visible(positions[:, :, None], positions[:, None, :], window, causal=causal))
    if size is not None:
        rule &= np.asarray(block_causal(positions[:, :, None], positions[:, None, :], size))
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    mask = rule & same
    if kind == "hidden_row":
        mask[0, 11] = False  # a query that sees no key at all
    spans = tuple(
        key_span(s, min(s + CHUNK, T), T, window, causal, size) for s in range(0, T, CHUNK)
    )
    return mask, spans


@pytest.fixture(scope="module")
def inputs():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (B, T, KVH, G, DH))
    keys = jax.random.normal(ks[1], (B, KVH, T, DH))
    values = jax.random.normal(ks[2], (B, KVH, T, DH))
    weight = jax.random.normal(ks[3], (B, T, KVH, G, DH))
    return q, keys, values, weight


def _value_and_grads(fn, inputs, mask):
    q, keys, values, weight = inputs

    def loss(q, k, v):
        out = fn(q, k, v, jnp.asarray(mask))
        return jnp.sum(out * weight), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, keys, values)
    return out, grads


@pytest.mark.parametrize(
    "kind", ["causal", "window", "bidirectional", "block", "hidden_row"]
)  # fmt: skip
def test_matches_dense_reference(inputs, kind):
    mask, spans = _mask(kind)
    flash = jax.jit(lambda q, k, v, m: flash_attention(q, k, v, m, spans, CHUNK, BLOCK))
    dense = jax.jit(lambda q, k, v, m: _reference(q, k, v, m, spans, CHUNK))
    out, grads = _value_and_grads(flash, inputs, mask)
    ref_out, ref_grads = _value_and_grads(dense, inputs, mask)
    assert float(jnp.max(jnp.abs(out - ref_out))) < TOL
    for name, got, want in zip(("q", "keys", "values"), grads, ref_grads, strict=True):
        assert bool(jnp.all(jnp.isfinite(got))), name
        assert float(jnp.max(jnp.abs(got - want))) < TOL, name


def test_hidden_row_is_the_span_mean_without_score_gradient(inputs):
    mask, spans = _mask("hidden_row")
    q, keys, values, _ = inputs
    out = flash_attention(q, keys, values, jnp.asarray(mask), spans, CHUNK, BLOCK)
    low, high = spans[11 // CHUNK]
    mean = values[0, :, low:high].mean(axis=1)  # [KVH, Dh]
    np.testing.assert_allclose(out[0, 11], np.broadcast_to(mean[:, None], (KVH, G, DH)), atol=1e-6)

    def row(q):
        return flash_attention(q, keys, values, jnp.asarray(mask), spans, CHUNK, BLOCK)[0, 11].sum()

    assert float(jnp.abs(jax.grad(row)(q)).max()) == 0.0


def test_bad_mask_shape_names_the_field(inputs):
    q, keys, values, _ = inputs
    with pytest.raises(ValueError, match="mask: expected shape"):
        flash_attention(q, keys, values, jnp.ones((B, T, T - 1), bool), ((0, T),) * 5, CHUNK, BLOCK)

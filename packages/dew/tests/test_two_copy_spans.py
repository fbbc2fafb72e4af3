"""BD3-LM's two-copy pass over key spans equals the same pass over every key.

The reference below runs the decoder's layers on the same `two_copy_visible` mask with no
block size, so every query chunk reads all `2L` keys; the pass under test
(`two_copy=True`) reads only the spans of `dew.models.two_copy`. `QUERY_CHUNK` is lowered
so that the short rows here still span several query chunks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models import layers
from dew.models.layers import two_copy_visible
from dew.models.two_copy import clean_span, noised_spans
from dew.testing import tiny_decoder

V = 23


def _all_keys(module, ids, seg, pos, size):  # noqa: ANN001, ANN202
    """Noised-copy logits of the two-copy pass with every key read (no span bound)."""
    mask = module._mask(seg, pos, False, size, True)
    cos, sin = module._tables(pos)
    x = module.embed_tokens(ids)
    for layer in module.layers:
        x, _ = layer(x, cos, sin, mask, False, None)
    return module.logits_from_hidden(module.norm(x)[:, : ids.shape[1] // 2])


def _rows(half: int, packed: bool):  # noqa: ANN202
    """Ids `[2, 2L]`, segments and positions (both copies alike), and the real-token mask."""
    rng = np.random.default_rng(half)
    tokens = rng.integers(0, V, (2, half))
    noisy = np.where(rng.random((2, half)) < 0.5, V - 1, tokens)
    seg = np.ones((2, half), np.int32)
    pos = np.tile(np.arange(half, dtype=np.int32), (2, 1))
    if packed:  # row 1: documents of 3 and half - 5 tokens, then 2 padding tokens
        seg[1] = [1] * 3 + [2] * (half - 5) + [0, 0]
        pos[1] = list(range(3)) + list(range(half - 5)) + [0, 0]
    ids = np.concatenate([noisy, tokens], axis=1)
    two = (jnp.asarray(ids, jnp.int32), jnp.asarray(np.tile(seg, 2)), jnp.asarray(np.tile(pos, 2)))
    return two, seg > 0


def _compare(half: int, size: int, chunk: int, packed: bool, monkeypatch, **overrides) -> None:  # noqa: ANN001
    monkeypatch.setattr(layers, "QUERY_CHUNK", chunk)
    model = tiny_decoder(V, half, num_layers=2, num_kv_heads=1, **overrides)
    (ids, seg, pos), real = _rows(half, packed)
    variables = model.init(jax.random.key(0), ids[:, :half])
    weights = jax.random.normal(jax.random.key(1), (2, half, V)) * jnp.asarray(real)[..., None]

    def spans(params):  # noqa: ANN001, ANN202
        kwargs = dict(causal=False, block_size=size, two_copy=True)
        return model.apply({"params": params}, ids, seg, pos, **kwargs)

    def dense(params):  # noqa: ANN001, ANN202
        return model.apply({"params": params}, ids, seg, pos, size, method=_all_keys)

    keep = np.asarray(real)
    results = []
    for run in (spans, dense):
        loss = jax.value_and_grad(lambda p, run=run: _weighted(run(p), weights), has_aux=True)
        (_, logits), grads = jax.jit(loss)(variables["params"])
        results.append((np.asarray(logits)[keep], jax.tree.leaves(grads)))
    (got, g_got), (want, g_want) = results
    np.testing.assert_allclose(got, want, atol=1e-5)
    for a, b in zip(g_got, g_want, strict=True):
        assert float(jnp.abs(b).max()) > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def _weighted(logits: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.sum(logits * weights), logits


@pytest.mark.parametrize("size", [1, 4])
def test_spans_match_all_keys_over_several_chunks(size: int, monkeypatch) -> None:  # noqa: ANN001
    _compare(16, size, 4, False, monkeypatch)


@pytest.mark.parametrize("size", [2, 8])
def test_spans_match_all_keys_when_the_row_is_not_a_multiple_of_the_chunk(
    size: int,
    monkeypatch,  # noqa: ANN001
) -> None:
    _compare(10, size, 4, False, monkeypatch)


@pytest.mark.parametrize("size", [2, 4])
def test_spans_match_all_keys_on_packed_rows_with_restarting_blocks(
    size: int,
    monkeypatch,  # noqa: ANN001
) -> None:
    # documents that do not start at a multiple of the block size, and padding
    _compare(12, size, 4, True, monkeypatch)


def test_spans_match_all_keys_under_gradient_checkpointing(monkeypatch) -> None:  # noqa: ANN001
    _compare(12, 4, 8, True, monkeypatch, remat="full")


def test_spans_cover_every_visible_key() -> None:
    for half in (5, 8, 12):
        for size in (1, 2, 3, 4, 8):
            for chunk in (1, 3, 4, 16):
                for shift in range(size):  # the first document ends `shift` tokens early
                    _check_cover(half, size, chunk, shift)


def _check_cover(half: int, size: int, chunk: int, shift: int) -> None:
    """Every key `two_copy_visible` shows a query lies in that query's chunk's spans."""
    cut = max(1, half // 2 - shift)
    pos = np.concatenate([np.arange(cut), np.arange(half - cut)])
    seg = np.concatenate([np.ones(cut, int), np.full(half - cut, 2)])
    idx = np.arange(2 * half)
    p2, s2 = np.tile(pos, 2), np.tile(seg, 2)
    seen = np.asarray(two_copy_visible(idx[:, None], idx[None, :], p2[:, None], p2[None, :],
                                       size, half))  # fmt: skip
    seen &= s2[:, None] == s2[None, :]
    for start in range(0, half, chunk):
        end = min(start + chunk, half)
        inside = np.zeros(2 * half, bool)
        for low, high in noised_spans(start, end, half, size):
            assert low < high
            inside[low:high] = True
        assert not seen[start:end, ~inside].any()
        low, high = clean_span(start, end, half, size)
        inside = np.zeros(2 * half, bool)
        inside[low:high] = True
        assert not seen[half + start : half + end, ~inside].any()


def test_a_first_chunk_of_one_query_has_no_clean_span() -> None:
    assert noised_spans(0, 1, 6, 2) == ((0, 2),)
    assert noised_spans(0, 4, 8, 4) == ((0, 7), (8, 11))
    assert clean_span(4, 8, 8, 4) == (8, 16)
    assert clean_span(0, 2, 8, 4) == (8, 13)


def test_spans_match_all_keys_with_one_query_per_chunk(monkeypatch) -> None:  # noqa: ANN001
    # the first noised chunk then has no clean key to read: a single span
    _compare(6, 2, 1, False, monkeypatch)

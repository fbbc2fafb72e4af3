"""Block-causal canvas generation with a key/value cache of finished blocks.

The cached path (block-causal prefill of the prompt, `extend` over one block per step)
must compute what the whole-canvas block-causal pass computes: the same tokens and fill
order for a key, and per-step logits equal up to float32 summation order. The decoder's
chunk-with-cache attention is checked against the whole-row block-causal mask directly,
with and without a sliding window, on rows of different prompt lengths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.inference.canvas import Canvas, CanvasGeneration
from dew.sampling import Sampling
from dew.testing import tiny_decoder

MASK, REAL, VOCAB, MAX_LEN = 11, 11, 12, 32
# Logits are float32 of magnitude ~1-10; the two paths differ only in summation order.
ATOL, RTOL = 2e-5, 1e-5
SAMPLING = Sampling(temperature=1.0)
# No empty prompt here: an empty prompt's first block is all mask ids, whose positions then
# get the same logits in exact arithmetic (equal values everywhere), and rounding alone
# orders their confidences. The empty prompt is checked at the logits level below.
PROMPTS = {2: [[1, 2, 3, 4], [5, 6]], 4: [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 1, 2]]}


def _decoder(**overrides):
    model = tiny_decoder(VOCAB, MAX_LEN, init_std=0.5, num_layers=2, num_kv_heads=1, **overrides)
    return model, model.init(jax.random.key(0), np.zeros((1, 8), np.int32))


@pytest.fixture(scope="module")
def decoder():
    return _decoder()


@pytest.fixture(scope="module")
def passes(decoder):
    """Jitted whole-row block-causal logits, block-causal prefill and `extend`."""
    model, variables = decoder

    @jax.jit(static_argnames="block")
    def whole(ids, segments, positions, block):
        return model.apply(variables, ids, segments, positions, causal=False, block_size=block)

    @jax.jit(static_argnames=("capacity", "block"))
    def prefill(ids, lengths, capacity, block):
        return model.apply(variables, ids, lengths, capacity, block_size=block, method="prefill")

    @jax.jit
    def extend(tokens, cache):
        return model.apply(variables, tokens, cache, method="extend")

    return whole, prefill, extend


@pytest.fixture(scope="module")
def generated(decoder):
    """(strategy, block length) -> (cached outputs, uncached outputs, cached generator),
    two keys each, the same prompts for both paths."""
    model, variables = decoder
    found = {}
    for remasking in ("ancestral", "low_confidence"):
        for length in (2, 4):
            outs = []
            for cache in (True, False):
                canvas = Canvas(
                    MASK, REAL, steps=8, remasking=remasking, block_length=length,
                    block_causal=True, kv_cache=cache,
                )  # fmt: skip
                gen = CanvasGeneration(model, variables, canvas=canvas)
                outs.append([gen(PROMPTS[length], 8, key, SAMPLING) for key in (3, 4)])
            found[remasking, length] = (*outs, gen)
    return found


def _canvas(prompts, width, gen_ids):
    """Left-padded canvas `[B, W + G]`, its segments and positions (as the generator builds)."""
    b, g = gen_ids.shape
    ids = np.full((b, width + g), 0, np.int32)
    segments = np.zeros_like(ids)
    positions = np.zeros_like(ids)
    for i, row in enumerate(prompts):
        start = width - len(row)
        ids[i, start:width] = row
        ids[i, width:] = gen_ids[i]
        segments[i, start:] = 1
        positions[i, start:] = np.arange(len(row) + g)
    return ids, segments, positions


@pytest.mark.parametrize("remasking", ["ancestral", "low_confidence"])
@pytest.mark.parametrize("length", [2, 4])
def test_cached_canvas_gives_the_uncached_tokens(generated, remasking, length) -> None:
    cached, uncached, gen = generated[remasking, length]
    for per_key_cached, per_key_uncached in zip(cached, uncached):
        for a, b in zip(per_key_cached, per_key_uncached):
            assert not np.any(a.ids == MASK)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.order, b.order)
    # the two keys draw differently, and one program serves both calls
    assert any(not np.array_equal(a.ids, b.ids) for a, b in zip(*cached))
    assert gen.compile_count == 1


@pytest.mark.parametrize("remasking", ["ancestral", "low_confidence"])
def test_every_step_sees_the_same_logits(decoder, passes, generated, remasking) -> None:
    """Rebuild the canvas each iteration read (from `order`) and compare the block's
    logits: whole canvas with the block-causal mask vs prefill + finished blocks + extend."""
    whole, prefill, extend = passes
    length, prompts = 2, PROMPTS[2]
    outs = generated[remasking, length][0][0]
    gen_ids = np.stack([o.ids for o in outs])
    order = np.stack([o.order for o in outs])
    width = max(len(p) for p in prompts)
    left = np.zeros((len(prompts), width), np.int32)
    for i, row in enumerate(prompts):
        left[i, width - len(row) :] = row
    lengths = np.array([len(p) for p in prompts], np.int32)
    _, base = prefill(left, lengths, width + 8, length)
    per = Canvas(
        MASK, REAL, steps=8, remasking=remasking, block_length=length
    ).iterations_per_block(8)
    compared = 0
    for block in range(8 // length):
        cache = base
        for done in range(block):
            _, cache = extend(gen_ids[:, done * length : (done + 1) * length], cache)
        for step in range(per):
            seen = np.where(order < block * per + step, gen_ids, MASK)
            cols = slice(block * length, (block + 1) * length)
            if not np.any(seen[:, cols] == MASK):
                continue
            got, _ = extend(seen[:, cols], cache)
            ids, segments, positions = _canvas(prompts, width, seen)
            want = whole(ids, segments, positions, length)[:, width:][:, cols]
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
            compared += 1
    assert compared >= 8 // length * 2


@pytest.mark.parametrize("window", [None, 3])
def test_extend_equals_the_block_causal_mask(passes, window) -> None:
    """Prompts of 4, 2 and 0 ids (blocks of 2), then three 2-id chunks: every chunk's
    logits and the keys it appends equal the whole row read with the block-causal mask."""
    if window is None:
        whole, prefill, extend = passes
        model, variables = None, None
    else:
        model, variables = _decoder(sliding_window=window)
        whole = jax.jit(
            lambda i, s, p, block: model.apply(variables, i, s, p, causal=False, block_size=block),
            static_argnums=3,
        )
        prefill = jax.jit(
            lambda i, n, c, block: model.apply(
                variables, i, n, c, block_size=block, method="prefill"
            ),
            static_argnums=(2, 3),
        )
        extend = jax.jit(lambda t, c: model.apply(variables, t, c, method="extend"))
    prompts = [[1, 2, 3, 4], [5, 6], []]
    rng = np.random.default_rng(0)
    chunks = rng.integers(0, REAL, (3, 6)).astype(np.int32)
    left = np.array([[1, 2, 3, 4], [0, 0, 5, 6], [0, 0, 0, 0]], np.int32)
    _, cache = prefill(left, np.array([4, 2, 0], np.int32), 10, 2)
    ids, segments, positions = _canvas(prompts, 4, chunks)
    want = np.asarray(whole(ids, segments, positions, 2))[:, 4:]
    for k in range(3):
        got, cache = extend(chunks[:, 2 * k : 2 * k + 2], cache)
        np.testing.assert_allclose(got, want[:, 2 * k : 2 * k + 2], atol=ATOL, rtol=RTOL)
    np.testing.assert_array_equal(np.asarray(cache.lengths), [10, 8, 6])
    # Row 1's keys (prompt of 2 + 6 generated) sit at slots 0..7, as a prefill of all 8 puts them.
    full = np.concatenate([left[1:2, 2:], chunks[1:2]], axis=1)
    _, again = prefill(full, np.array([8], np.int32), 10, 2)
    for mine, ref in zip(cache.keys, again.keys):  # keys keep their slots last
        np.testing.assert_allclose(mine[1, ..., :8], ref[0, ..., :8], atol=ATOL, rtol=RTOL)
    for mine, ref in zip(cache.values, again.values):
        np.testing.assert_allclose(mine[1, :, :8], ref[0, :, :8], atol=ATOL, rtol=RTOL)


def test_chunk_masks_hide_later_slots_and_far_keys() -> None:
    from dew.models.chunk import chunk_masks

    old, own = chunk_masks(jnp.array([3, 0], jnp.int32), 2, 6, window=2)
    # row 0: queries at slots 3, 4; only slot 2 is filled and < 2 away from slot 3
    np.testing.assert_array_equal(np.asarray(old[0]), [[0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert not np.asarray(old[1]).any()  # nothing cached in row 1
    np.testing.assert_array_equal(np.asarray(own), [[1, 1], [1, 1]])


def test_bad_input_is_one_line(decoder) -> None:
    model, variables = decoder
    with pytest.raises(ValueError, match=r"^kv_cache: expected a bool, got 'yes'$"):
        Canvas(MASK, REAL, 4, block_length=2, block_causal=True, kv_cache="yes")
    with pytest.raises(ValueError, match=r"^block_size: expected a positive int or None, got 0"):
        model.apply(variables, np.zeros((1, 2), np.int32), np.array([2]), 4, block_size=0,
                    method="prefill")  # fmt: skip
    _, cache = model.apply(variables, np.zeros((1, 2), np.int32), np.array([2]), 4,
                           block_size=2, method="prefill")  # fmt: skip
    with pytest.raises(ValueError, match=r"^tokens: expected 2 dims, got shape \(2,\)"):
        model.apply(variables, np.zeros((2,), np.int32), cache, method="extend")
    gen = CanvasGeneration(
        model, variables, canvas=Canvas(MASK, REAL, 4, block_length=2, block_causal=True)
    )
    with pytest.raises(ValueError, match=r"^prompt_ids\[0\]: length 3 is not a multiple"):
        gen([1, 2, 3], 4, 0)
    # An empty prompt starts from an empty cache (no prefill) and still fills every position,
    # one per iteration (low confidence: 2 blocks of 2 ids, 2 steps each).
    out = gen([], 4, 0)
    assert out.ids.shape == (4,) and not np.any(out.ids == MASK)
    assert sorted(set(out.order.tolist())) == [0, 1, 2, 3]

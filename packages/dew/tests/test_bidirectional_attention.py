"""Bidirectional attention (``causal=False``): same parameters, every key of the segment seen."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.layers import block_causal, key_span, visible
from dew.testing import tiny_decoder

V, L = 12, 8


def _model(**overrides):  # noqa: ANN202
    return tiny_decoder(V, L, **overrides)


@pytest.mark.parametrize("window", [None, 3])
def test_bidirectional_sees_future_tokens_and_causal_does_not(window) -> None:  # noqa: ANN001
    model = _model(sliding_window=window)
    variables = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    ids = jnp.arange(1, L + 1, dtype=jnp.int32)[None] % V
    changed = ids.at[0, 4].set(0)
    for causal in (True, False):
        a = model.apply(variables, ids, causal=causal)
        b = model.apply(variables, changed, causal=causal)
        earlier = np.abs(np.asarray(a[0, 3] - b[0, 3])).max()
        far = np.abs(np.asarray(a[0, 0] - b[0, 0])).max()
        assert (earlier > 1e-6) == (not causal)
        # with a window of 3, position 0 is 4 away from position 4: never seen
        assert (far > 1e-6) == (not causal and window is None)


def test_bidirectional_keeps_packed_segments_apart() -> None:
    model = _model()
    variables = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    ids = jnp.arange(1, L + 1, dtype=jnp.int32)[None] % V
    seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]], jnp.int32)
    pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]], jnp.int32)
    a = model.apply(variables, ids, seg, pos, causal=False)
    b = model.apply(variables, ids.at[0, 5].set(0), seg, pos, causal=False)
    np.testing.assert_array_equal(np.asarray(a[0, :4]), np.asarray(b[0, :4]))
    assert np.abs(np.asarray(a[0, 4] - b[0, 4])).max() > 1e-6


def test_visible_and_key_span() -> None:
    q, k = np.arange(6)[:, None], np.arange(6)[None, :]
    np.testing.assert_array_equal(visible(q, k, None, causal=False), np.ones((6, 6), bool))
    np.testing.assert_array_equal(visible(q, k, 2, causal=False), np.abs(q - k) < 2)
    np.testing.assert_array_equal(visible(q, k, None), k <= q)
    assert key_span(4, 8, 10, None, True) == (0, 8)
    assert key_span(4, 8, 10, None, False) == (0, 10)
    assert key_span(4, 8, 10, 2, False) == (3, 9)
    assert key_span(4, 8, 10, 2, True) == (3, 8)


def test_block_causal_sees_its_block_and_earlier_blocks_only() -> None:
    model = _model()
    variables = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    ids = jnp.arange(1, L + 1, dtype=jnp.int32)[None] % V
    a = model.apply(variables, ids, causal=False, block_size=3)  # blocks 0-2, 3-5, 6-7
    b = model.apply(variables, ids.at[0, 4].set(0), causal=False, block_size=3)
    moved = np.abs(np.asarray(a[0] - b[0])).max(axis=-1) > 1e-6
    np.testing.assert_array_equal(moved, [0, 0, 0, 1, 1, 1, 1, 1])
    # one block covering the row is bidirectional attention; blocks of one are causal
    full = model.apply(variables, ids, causal=False)
    wide = model.apply(variables, ids, causal=False, block_size=L)
    np.testing.assert_allclose(np.asarray(wide), np.asarray(full), atol=1e-6)
    ones = model.apply(variables, ids, causal=False, block_size=1)
    np.testing.assert_allclose(np.asarray(ones), np.asarray(model.apply(variables, ids)), atol=1e-6)


def test_block_size_is_checked() -> None:
    model = _model()
    variables = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    ids = jnp.zeros((1, L), jnp.int32)
    with pytest.raises(ValueError, match="block_size: block-causal attention needs causal=False"):
        model.apply(variables, ids, block_size=2)
    with pytest.raises(ValueError, match="block_size: expected a positive int"):
        model.apply(variables, ids, causal=False, block_size=0)


def test_key_span_with_blocks() -> None:
    assert key_span(0, 4, 10, None, False, 3) == (0, 6)
    assert key_span(0, 4, 10, 2, False, 3) == (0, 5)
    np.testing.assert_array_equal(
        block_causal(np.arange(4)[:, None], np.arange(4)[None, :], 2),
        [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]],
    )

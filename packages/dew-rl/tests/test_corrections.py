"""Rollout corrections: TIS weights, IcePop, token and sequence rejection."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(9)
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], bool)


def test_behavior_importance_weights_caps_masks_and_detaches() -> None:
    old = jnp.asarray([[0.0, 1.0, -1.0, 30.0], [0.5, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    behavior = jnp.zeros((3, 4))
    got = np.asarray(rl.behavior_importance_weights(old, behavior, jnp.asarray(MASK), 2.0))
    want = np.where(MASK, np.minimum(np.exp(np.clip(np.asarray(old), -20, 20)), 2.0), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    grad = jax.grad(
        lambda o: rl.behavior_importance_weights(o, behavior, jnp.asarray(MASK), 2.0).sum()
    )(old)
    assert not np.asarray(grad).any()


def test_behavior_importance_weights_refuses_non_positive_cap() -> None:
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="cap: expected a positive"):
        rl.behavior_importance_weights(x, x, jnp.ones((1, 2), bool), 0.0)


def test_icepop_zeroes_outside_band() -> None:
    old = jnp.log(jnp.asarray([[0.4, 0.5, 1.0, 2.0], [2.5, 1.0, 1.0, 1.0], [1.0] * 4]))
    got = np.asarray(rl.icepop_weights(old, jnp.zeros((3, 4)), jnp.asarray(MASK), 0.5, 2.0))
    np.testing.assert_allclose(got, [[0.0, 0.5, 1.0, 2.0], [0.0, 1.0, 0.0, 0.0], [0.0] * 4])


def test_icepop_band_errors() -> None:
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="low: expected low <= high"):
        rl.icepop_weights(x, x, jnp.ones((1, 2), bool), 2.0, 1.0)
    with pytest.raises(ValueError, match="low: expected a positive"):
        rl.token_rejection_mask(x, x, jnp.ones((1, 2), bool), 0.0, 1.0)


def test_token_rejection_keeps_tokens_with_behavior_over_old_in_band() -> None:
    # k1 = -(old - behavior) = log(behavior / old); kept when behavior / old is in [0.5, 2].
    behavior = jnp.log(jnp.asarray([[0.4, 0.5, 2.0, 2.1], [1.0, 3.0, 1.0, 1.0], [1.0] * 4]))
    mask = jnp.asarray(MASK, jnp.int32)
    got = rl.token_rejection_mask(jnp.zeros((3, 4)), behavior, mask, 0.5, 2.0)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_sequence_rejection_sum_and_mean() -> None:
    behavior = np.array([[0.3, 0.3, 0.3, 0.3], [0.5, 0.5, 9.0, 9.0], [0.0] * 4])
    mask = jnp.asarray(MASK)
    old = jnp.zeros((3, 4))
    summed = rl.sequence_rejection_mask(old, jnp.asarray(behavior), mask, 0.5, 2.0)
    # Row 0 sums to 1.2 > log 2; row 1 (kept tokens only) to 1.0 > log 2: both rejected.
    np.testing.assert_array_equal(np.asarray(summed), np.zeros((3, 4), bool))
    averaged = rl.sequence_rejection_mask(old, jnp.asarray(behavior), mask, 0.5, 2.0, mean=True)
    # Means 0.3 and 0.5 are both inside [log 0.5, log 2] = [-0.69, 0.69].
    np.testing.assert_array_equal(np.asarray(averaged), MASK)
    assert math.log(2.0) < 1.0


def test_sequence_rejection_with_segments_judges_each_chain() -> None:
    behavior = jnp.asarray([[0.1, 0.1, 0.9, 0.9, 0.0]])
    mask = jnp.asarray([[1, 1, 1, 1, 1]], bool)
    segments = jnp.asarray([[1, 1, 2, 2, 0]], jnp.int32)
    got = rl.sequence_rejection_mask(jnp.zeros((1, 5)), behavior, mask, 0.5, 2.0, segments=segments)
    # Chain 1 sums to 0.2 (kept), chain 2 to 1.8 (rejected), padding comes back 0.
    np.testing.assert_array_equal(np.asarray(got), [[True, True, False, False, False]])

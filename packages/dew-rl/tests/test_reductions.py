"""Masked reductions: token_mean, masked_mean, the sequence reductions, whitening."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(7)
X = RNG.normal(size=(4, 6))
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],  # an all-masked row
        [1, 0, 0, 0, 0, 0],  # a one-token row
    ],
    dtype=bool,
)


def test_token_mean_divides_by_exact_count() -> None:
    got = rl.token_mean(jnp.asarray(X), jnp.asarray(MASK))
    assert float(got) == pytest.approx(X[MASK].sum() / MASK.sum(), rel=1e-15)


def test_token_mean_of_empty_mask_is_nan_but_masked_mean_is_zero() -> None:
    empty = jnp.zeros((2, 3), bool)
    x = jnp.ones((2, 3))
    assert np.isnan(float(rl.token_mean(x, empty)))
    assert float(rl.masked_mean(x, empty)) == 0.0


def test_masked_mean_adds_eps_in_mask_dtype() -> None:
    x = jnp.asarray(X)
    n = MASK.sum()
    # Boolean mask: verl's 1e-8 is added in float32, where it vanishes next to any count >= 1.
    by_bool = float(rl.masked_mean(x, jnp.asarray(MASK)))
    assert by_bool == pytest.approx(X[MASK].sum() / n, rel=1e-14)
    assert by_bool == float(rl.token_mean(x, jnp.asarray(MASK)))
    # float64 mask: the 1e-8 survives, exactly as torch keeps it for a float64 mask.
    by_float = float(rl.masked_mean(x, jnp.asarray(MASK, jnp.float64)))
    assert by_bool / by_float == pytest.approx((n + 1e-8) / n, rel=1e-15)
    assert by_bool != by_float


def test_masked_mean_along_axis_gives_zero_for_empty_rows() -> None:
    got = np.asarray(rl.masked_mean(jnp.asarray(X), jnp.asarray(MASK), axis=-1))
    expected = [X[b][MASK[b]].mean() if MASK[b].any() else 0.0 for b in range(4)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_sequence_reductions_skip_empty_rows() -> None:
    x, mask = jnp.asarray(X), jnp.asarray(MASK)
    rows = [b for b in range(4) if MASK[b].any()]
    means = [X[b][MASK[b]].mean() for b in rows]
    sums = [X[b][MASK[b]].sum() for b in rows]
    assert float(rl.sequence_mean(x, mask)) == pytest.approx(np.mean(means), rel=1e-12)
    assert float(rl.sequence_sum_mean(x, mask)) == pytest.approx(np.mean(sums), rel=1e-12)
    assert float(rl.sequence_sum_norm(x, mask)) == pytest.approx(np.mean(sums) / 6, rel=1e-12)
    assert float(rl.sequence_sum_norm(x, mask, norm=4096)) == pytest.approx(
        np.mean(sums) / 4096, rel=1e-12
    )


def test_sequence_reductions_of_empty_batch_are_nan() -> None:
    x, empty = jnp.ones((2, 3)), jnp.zeros((2, 3), bool)
    for fn in (rl.sequence_mean, rl.sequence_sum_mean, rl.sequence_sum_norm):
        assert np.isnan(float(fn(x, empty)))


def test_sequence_sum_norm_rejects_non_positive_norm() -> None:
    with pytest.raises(ValueError, match="norm"):
        rl.sequence_sum_norm(jnp.ones((2, 3)), jnp.ones((2, 3), bool), norm=0)


def test_segment_mean_pools_each_chain() -> None:
    x = jnp.asarray([[1.0, 2.0, 3.0, 10.0, 20.0, 99.0]])
    mask = jnp.asarray([[1, 1, 0, 1, 1, 1]], bool)
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0]], jnp.int32)
    got = np.asarray(rl.segment_mean(x, mask, segments))
    np.testing.assert_allclose(got, [[1.5, 1.5, 1.5, 15.0, 15.0, 0.0]])


def test_segment_mean_of_chain_without_kept_token_is_zero() -> None:
    x = jnp.asarray([[5.0, 6.0, 7.0]])
    got = rl.segment_mean(x, jnp.asarray([[0, 1, 1]], bool), jnp.asarray([[1, 2, 2]]))
    np.testing.assert_allclose(np.asarray(got), [[0.0, 6.5, 6.5]])


def test_masked_whiten_gives_zero_mean_unit_unbiased_std() -> None:
    x, mask = jnp.asarray(X), jnp.asarray(MASK)
    white = np.asarray(rl.masked_whiten(x, mask))
    kept = white[MASK]
    assert abs(kept.mean()) < 1e-12
    assert kept.std(ddof=1) == pytest.approx(1.0, rel=1e-6)
    # Positions outside the mask are whitened with the same statistics.
    mean, std = X[MASK].mean(), X[MASK].std(ddof=1)
    np.testing.assert_allclose(white[~MASK], (X[~MASK] - mean) / std, rtol=1e-6)


def test_masked_whiten_with_one_kept_position_is_nan() -> None:
    mask = jnp.zeros((2, 3), bool).at[0, 1].set(True)
    assert np.isnan(np.asarray(rl.masked_whiten(jnp.ones((2, 3)), mask))).all()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_masked_whiten_runs_in_at_least_float32(dtype: jnp.dtype) -> None:
    out = rl.masked_whiten(jnp.asarray(X, dtype), jnp.asarray(MASK))
    assert out.dtype == jnp.float32


def test_masked_whiten_keeps_float64() -> None:
    assert rl.masked_whiten(jnp.asarray(X), jnp.asarray(MASK)).dtype == jnp.float64


def test_reductions_keep_input_dtype() -> None:
    x, mask = jnp.asarray(X, jnp.float32), jnp.asarray(MASK)
    for fn in (rl.token_mean, rl.masked_mean, rl.sequence_mean, rl.sequence_sum_mean):
        assert fn(x, mask).dtype == jnp.float32


def test_errors_name_the_field() -> None:
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="mask: expected the shape of x"):
        rl.token_mean(x, jnp.ones((2, 4), bool))
    with pytest.raises(TypeError, match="x: expected a floating-point array"):
        rl.masked_mean(jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool))
    with pytest.raises(TypeError, match="segments: expected integer"):
        rl.segment_mean(x, jnp.ones((2, 3), bool), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"x: expected shape \[B, T\]"):
        rl.sequence_mean(jnp.ones(3), jnp.ones(3, bool))


def test_gradient_of_token_mean_is_mask_over_count() -> None:
    grad = jax.grad(rl.token_mean)(jnp.asarray(X), jnp.asarray(MASK))
    np.testing.assert_allclose(np.asarray(grad), MASK / MASK.sum(), rtol=1e-15)


def test_half_precision_result_dtypes_follow_verl() -> None:
    # verl divides a bfloat16 sum by an int64 count (bfloat16 result) in token-mean, by a
    # float32 count in masked_mean (float32 result), and its sequence statistics are float32.
    x = jnp.asarray(X, jnp.bfloat16)
    mask = jnp.asarray(MASK)
    assert rl.token_mean(x, mask).dtype == jnp.bfloat16
    assert rl.masked_mean(x, mask).dtype == jnp.float32
    assert rl.masked_mean(x, mask.astype(jnp.bfloat16)).dtype == jnp.bfloat16
    for fn in (rl.sequence_mean, rl.sequence_sum_mean, rl.sequence_sum_norm):
        assert fn(x, mask).dtype == jnp.float32


def test_half_precision_division_rounds_once() -> None:
    # 257 tokens: bfloat16 cannot hold 257 (it rounds to 256). The bfloat16 sum is divided
    # by the exact count in float32 and rounded once, as torch does.
    x = jnp.full((1, 257), 0.1, jnp.bfloat16)
    mask = jnp.ones((1, 257), bool)
    total = jnp.sum(x)
    expected = (total.astype(jnp.float32) / jnp.float32(257)).astype(jnp.bfloat16)
    rounded_count = total / jnp.asarray(257, jnp.bfloat16)
    assert expected != rounded_count
    assert rl.token_mean(x, mask) == expected


def test_group_sums_match_a_per_id_loop_wherever_members_sit() -> None:
    ids = RNG.integers(-3, 4, size=X.shape)
    x = np.where(MASK, X, np.nan)  # dropped positions hold nan
    sums, counts = rl.group_sums(jnp.asarray(x), jnp.asarray(MASK), jnp.asarray(ids))
    kept_ids = sorted(set(ids[MASK].tolist()))
    first = 1 if (~MASK).any() else 0  # one empty slot for the dropped positions
    assert float(sums[0]) == 0.0 and int(counts[0]) == 0
    for slot, group in enumerate(kept_ids, start=first):
        members = MASK & (ids == group)
        assert int(counts[slot]) == members.sum()
        assert float(sums[slot]) == pytest.approx(X[members].sum(), rel=1e-12)
    assert not np.asarray(counts[first + len(kept_ids) :]).any()
    assert not np.asarray(sums[first + len(kept_ids) :]).any()


def test_group_sums_jit_and_differentiate_like_a_masked_sum() -> None:
    ids = jnp.asarray(np.tile([[2, 1, 2, 1, 3, 3]], (4, 1)))
    grad = jax.grad(lambda x: jax.jit(rl.group_sums)(x, jnp.asarray(MASK), ids)[0][1])(
        jnp.asarray(X)
    )
    np.testing.assert_array_equal(np.asarray(grad), MASK & (np.asarray(ids) == 1))


def test_group_sums_refuse_floating_ids() -> None:
    with pytest.raises(TypeError, match="group_ids: expected integer"):
        rl.group_sums(jnp.asarray(X), jnp.asarray(MASK), jnp.zeros(X.shape))

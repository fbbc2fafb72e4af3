"""kl_reward, adaptive_kl_coefficient and overlong_penalty: edge cases and refusals (verl parity
lives in tests/parity/test_reward_shaping_parity.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import rl


def test_kl_reward_masked_tokens_are_not_charged_and_empty_rows_count_zero() -> None:
    scores = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    kl = jnp.array([[2.0, 2.0, 100.0], [5.0, 5.0, 5.0]])
    mask = jnp.array([[True, True, False], [False, False, False]])
    rewards, current_kl = rl.kl_reward(scores, kl, mask, 0.5)
    np.testing.assert_allclose(rewards, [[-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # row 0's mean is 2 (over 2 + 1e-8), row 1 has no token: verl's masked_mean gives 0 there
    assert float(current_kl) == pytest.approx(1.0, rel=1e-6)


def test_kl_reward_nan_under_the_mask_stays_out() -> None:
    kl = jnp.array([[0.1, jnp.nan]])
    rewards, current_kl = rl.kl_reward(jnp.zeros((1, 2)), kl, jnp.array([[1, 0]]), 1.0)
    assert np.all(np.isfinite(np.asarray(rewards))) and math.isfinite(float(current_kl))


def test_kl_reward_jits_with_a_traced_beta() -> None:
    scores, kl, mask = jnp.zeros((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3), bool)
    rewards, _ = jax.jit(rl.kl_reward)(scores, kl, mask, jnp.float32(0.25))
    np.testing.assert_allclose(rewards, -0.25 * np.ones((2, 3)))


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((jnp.zeros((2,)), jnp.zeros((2,)), jnp.ones((2,)), 0.1), "token_scores"),
        ((jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)), 0.1), "kl"),
        ((jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((3, 3)), 0.1), "mask"),
        ((jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3)), math.inf), "beta"),
    ],
)
def test_kl_reward_refuses_bad_input(args: tuple, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        rl.kl_reward(*args)


def test_adaptive_coefficient_moves_toward_the_target_and_is_bounded() -> None:
    up = rl.adaptive_kl_coefficient(0.1, 100.0, 10, target=0.1, horizon=10)
    down = rl.adaptive_kl_coefficient(0.1, 0.0, 10, target=0.1, horizon=10)
    assert up == pytest.approx(0.12) and down == pytest.approx(0.08)
    assert rl.adaptive_kl_coefficient(0.1, 0.1, 10, target=0.1, horizon=10) == 0.1
    assert rl.adaptive_kl_coefficient(0.1, 5.0, 0, target=0.1, horizon=10) == 0.1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"coefficient": -0.1}, "coefficient"),
        ({"coefficient": math.nan}, "coefficient"),
        ({"current_kl": math.inf}, "current_kl"),
        ({"n_steps": -1}, "n_steps"),
        ({"n_steps": 1.5}, "n_steps"),
        ({"target": 0.0}, "target"),
        ({"horizon": -5}, "horizon"),
    ],
)
def test_adaptive_coefficient_refuses_bad_input(kwargs: dict, field: str) -> None:
    args = {"coefficient": 0.1, "current_kl": 0.2, "n_steps": 4, "target": 0.1, "horizon": 100}
    with pytest.raises(ValueError, match=field):
        rl.adaptive_kl_coefficient(**{**args, **kwargs})


def test_overlong_penalty_ramp() -> None:
    got = rl.overlong_penalty(jnp.array([0, 4, 6, 8]), 8, buffer=4, penalty_factor=2.0)
    np.testing.assert_allclose(got, [0.0, 0.0, -1.0, -2.0])
    assert got.dtype == jnp.float32
    assert not np.any(np.signbit(np.asarray(got)[:2]))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"buffer": 0}, "buffer"),
        ({"buffer": 9}, "buffer"),
        ({"max_length": 0}, "max_length"),
        ({"penalty_factor": -1.0}, "penalty_factor"),
        ({"lengths": jnp.zeros((2, 2))}, "lengths"),
    ],
)
def test_overlong_penalty_refuses_bad_input(kwargs: dict, field: str) -> None:
    args = {"lengths": jnp.array([1, 2]), "max_length": 8, "buffer": 4, "penalty_factor": 1.0}
    with pytest.raises(ValueError, match=field):
        rl.overlong_penalty(**{**args, **kwargs})

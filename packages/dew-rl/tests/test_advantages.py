"""gae, group_advantage and rloo_advantage."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(11)


def reference_gae(rewards, values, mask, gamma, lam):
    """A plain loop over steps, written from the recursion, for comparison."""
    batch, width = rewards.shape
    advantages = np.zeros((batch, width))
    for b in range(batch):
        next_value = next_adv = 0.0
        for t in reversed(range(width)):
            if mask[b, t]:
                delta = rewards[b, t] + gamma * next_value - values[b, t]
                next_adv = delta + gamma * lam * next_adv
                next_value = values[b, t]
            advantages[b, t] = next_adv
    returns = advantages + values
    kept = advantages[mask]
    # verl's Bessel factor n / (n - 1) is an int64 division, which torch does in float32.
    bessel = float(np.float32(kept.size) / np.float32(kept.size - 1))
    white = (advantages - kept.mean()) / np.sqrt(kept.var() * bessel + 1e-8)
    return white, returns


def test_gae_matches_the_recursion_with_gaps_and_padding() -> None:
    rewards, values = RNG.normal(size=(3, 7)), RNG.normal(size=(3, 7))
    mask = np.array(
        [
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1, 1, 0],  # observation tokens in the middle, padding at the end
            [1, 0, 0, 0, 0, 0, 0],  # a one-step sequence
        ],
        dtype=bool,
    )
    adv, ret = rl.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), 0.99, 0.9)
    want_adv, want_ret = reference_gae(rewards, values, mask, 0.99, 0.9)
    np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-10, atol=1e-12)


def test_gae_single_step_is_reward_minus_value_before_whitening() -> None:
    rewards, values = jnp.asarray([[2.0], [5.0]]), jnp.asarray([[0.5], [1.0]])
    _, returns = rl.gae(rewards, values, jnp.ones((2, 1), bool), 0.9, 0.8)
    # A = r - V, so the returns are exactly the rewards.
    np.testing.assert_allclose(np.asarray(returns), [[2.0], [5.0]])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gae_runs_in_float32_for_half_inputs(dtype: jnp.dtype) -> None:
    rewards = RNG.normal(size=(2, 5))
    values = RNG.normal(size=(2, 5))
    mask = jnp.ones((2, 5), bool)
    adv, ret = rl.gae(jnp.asarray(rewards, dtype), jnp.asarray(values, dtype), mask, 0.99, 0.95)
    assert adv.dtype == ret.dtype == jnp.float32
    # Same as running the float32 path on the half-precision values widened to float32.
    r32 = jnp.asarray(rewards, dtype).astype(jnp.float32)
    v32 = jnp.asarray(values, dtype).astype(jnp.float32)
    adv32, ret32 = rl.gae(r32, v32, mask, 0.99, 0.95)
    np.testing.assert_array_equal(np.asarray(adv), np.asarray(adv32))
    np.testing.assert_array_equal(np.asarray(ret), np.asarray(ret32))


def test_gae_carries_no_gradient() -> None:
    rewards = jnp.asarray(RNG.normal(size=(2, 4)))
    grad = jax.grad(lambda r: rl.gae(r, r, jnp.ones((2, 4), bool), 0.9, 0.9)[1].sum())(rewards)
    assert not np.asarray(grad).any()


def test_group_advantage_normalises_within_groups() -> None:
    rewards = RNG.normal(size=8)
    got = np.asarray(rl.group_advantage(jnp.asarray(rewards), 4))
    groups = rewards.reshape(2, 4)
    want = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-12)


def test_group_advantage_population_deviation_is_flow_grpos() -> None:
    """ddof=0: numpy's population deviation (Flow-GRPO's ``np.std``) with eps 1e-4."""
    rewards = RNG.normal(size=12)
    got = np.asarray(rl.group_advantage(jnp.asarray(rewards), 4, eps=1e-4, ddof=0))
    groups = rewards.reshape(3, 4)
    want = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-12)
    unbiased = np.asarray(rl.group_advantage(jnp.asarray(rewards), 4, eps=1e-4))
    assert not np.allclose(got, unbiased)  # the estimators differ by sqrt(G / (G - 1))


def test_group_advantage_population_group_of_one_is_zero() -> None:
    """Flow-GRPO's group of one is its own mean: advantage 0, not verl's r / (1 + eps)."""
    rewards = jnp.asarray([0.3, -2.0, 4.0])
    np.testing.assert_array_equal(np.asarray(rl.group_advantage(rewards, 1, ddof=0)), 0.0)
    np.testing.assert_array_equal(
        np.asarray(rl.group_advantage(rewards, 1, normalise_by_std=False, ddof=0)), 0.0
    )


@pytest.mark.parametrize("ddof", [2, -1, True, 0.0])
def test_group_advantage_ddof_error_names_the_field(ddof) -> None:
    message = "ddof: expected 1 (unbiased deviation, verl) or 0 (population deviation, Flow-GRPO)"
    with pytest.raises(ValueError, match=re.escape(f"{message}, got {ddof!r}")):
        rl.group_advantage(jnp.ones(4), 2, ddof=ddof)


def test_group_advantage_dr_grpo_only_centres() -> None:
    rewards = RNG.normal(size=6)
    got = np.asarray(rl.group_advantage(jnp.asarray(rewards), 3, normalise_by_std=False))
    groups = rewards.reshape(2, 3)
    np.testing.assert_allclose(got, (groups - groups.mean(1, keepdims=True)).reshape(-1))


def test_group_advantage_zero_spread_group_gives_zeros() -> None:
    rewards = jnp.asarray([1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    got = np.asarray(rl.group_advantage(rewards, 3))
    np.testing.assert_array_equal(got[:3], 0.0)
    assert np.isfinite(got).all()


def test_group_of_one_divides_by_float32_one_plus_eps() -> None:
    rewards = jnp.asarray([0.3, -2.0, 4.0])
    got = np.asarray(rl.group_advantage(rewards, 1))
    scale = float(np.float32(1.0) + np.float32(rl.GROUP_EPS))
    np.testing.assert_array_equal(got, np.asarray(rewards) / scale)
    np.testing.assert_array_equal(
        np.asarray(rl.group_advantage(rewards, 1, normalise_by_std=False)), np.asarray(rewards)
    )


def test_group_eps_is_verls_default() -> None:
    assert rl.GROUP_EPS == 1e-6


def test_rloo_leaves_one_out() -> None:
    rewards = jnp.asarray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    got = np.asarray(rl.rloo_advantage(rewards, 3))
    np.testing.assert_allclose(got, [1 - 2.5, 2 - 2.0, 3 - 1.5, 4 - 5.5, 5 - 5.0, 6 - 4.5])


def test_rloo_group_of_one_returns_reward() -> None:
    rewards = jnp.asarray([0.5, -1.0])
    np.testing.assert_array_equal(np.asarray(rl.rloo_advantage(rewards, 1)), [0.5, -1.0])


@pytest.mark.parametrize("fn", [rl.group_advantage, rl.rloo_advantage])
def test_group_errors_name_the_field(fn) -> None:
    with pytest.raises(ValueError, match="rewards: expected a length divisible by group=4"):
        fn(jnp.ones(6), 4)
    with pytest.raises(ValueError, match="group: expected a positive Python int"):
        fn(jnp.ones(6), 0)
    with pytest.raises(ValueError, match=r"rewards: expected shape \[B\]"):
        fn(jnp.ones((2, 3)), 3)


def test_group_functions_jit_with_static_group() -> None:
    rewards = jnp.asarray(RNG.normal(size=8))
    jitted = jax.jit(rl.group_advantage, static_argnames=("group", "normalise_by_std", "ddof"))
    np.testing.assert_allclose(
        np.asarray(jitted(rewards, group=4)), np.asarray(rl.group_advantage(rewards, 4))
    )
    np.testing.assert_allclose(
        np.asarray(jitted(rewards, group=4, ddof=0)),
        np.asarray(rl.group_advantage(rewards, 4, ddof=0)),
    )
    jitted_rloo = jax.jit(rl.rloo_advantage, static_argnames="group")
    np.testing.assert_allclose(
        np.asarray(jitted_rloo(rewards, group=2)), np.asarray(rl.rloo_advantage(rewards, 2))
    )


def test_gae_float32_rounds_every_operation_like_torch() -> None:
    # numpy rounds each float32 product and sum separately, as torch's eager ops do; a
    # fused multiply-add in the compiled recursion would round once and differ in the
    # last bits.
    rng = np.random.default_rng(21)
    rewards = rng.normal(size=(16, 40)).astype(np.float32)
    values = rng.normal(size=(16, 40)).astype(np.float32)
    mask = np.arange(40)[None, :] < rng.integers(1, 41, 16)[:, None]
    gamma, decay = np.float32(0.99), np.float32(0.99 * 0.95)
    next_value = np.zeros(16, np.float32)
    last = np.zeros(16, np.float32)
    expected = np.zeros((16, 40), np.float32)
    for t in reversed(range(40)):
        delta = (rewards[:, t] + gamma * next_value) - values[:, t]
        advantage = delta + decay * last
        next_value = np.where(mask[:, t], values[:, t], next_value)
        last = np.where(mask[:, t], advantage, last)
        expected[:, t] = last
    gae = jax.jit(rl.gae, static_argnames=("gamma", "lam"))
    _, returns = gae(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma=0.99, lam=0.95
    )
    np.testing.assert_array_equal(np.asarray(returns), expected + values)

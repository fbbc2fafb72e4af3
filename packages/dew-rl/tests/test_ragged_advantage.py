"""ragged_group_advantage: groups of any size named by ids, groups of one, dropped members.

The reference below is the verl 0.9.1 rule written as a plain loop over groups (a dict from id
to members, mean 0 and deviation 1 for a group of one, unbiased deviation + eps), which is
how ``compute_grpo_outcome_advantage`` and ``compute_rloo_outcome_advantage`` group by their
``index``. Parity with verl's own output on ragged groups is in the workspace's
``tests/parity/test_ragged_advantage_parity.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dew.rl as rl

ESTIMATORS = ("group", "mean", "rloo")
B = 10
rewards_st = hnp.arrays(np.float64, (B,), elements=st.floats(-4.0, 4.0, width=64))
ids_st = hnp.arrays(np.int64, (B,), elements=st.integers(-3, 3))
masks_st = hnp.arrays(np.bool_, (B,))

# One compiled function per estimator, shared by every example (shapes are fixed).
RAGGED = {e: jax.jit(functools.partial(rl.ragged_group_advantage, estimator=e)) for e in ESTIMATORS}


def reference(rewards, ids, keep, estimator, eps=rl.GROUP_EPS) -> np.ndarray:
    """verl's grouping by index, in float64, over the kept members only."""
    out = np.zeros(len(rewards))
    members: dict[int, list[int]] = {}
    for i, (key, kept) in enumerate(zip(ids, keep)):
        if kept:
            members.setdefault(int(key), []).append(i)
    for idx in members.values():
        group = np.asarray(rewards, np.float64)[idx]
        n = group.size
        mean, std = (0.0, 1.0) if n == 1 else (group.mean(), group.std(ddof=1))
        # verl's deviation of a group of one is a float32 tensor: 1 + eps is a float32 sum.
        scale = float(np.float32(1.0) + np.float32(eps)) if n == 1 else std + eps
        if estimator == "group":
            out[idx] = (group - mean) / scale
        elif estimator == "mean":
            out[idx] = group - mean
        else:
            out[idx] = group if n == 1 else group - (group.sum() - group) / (n - 1)
    return out


@pytest.mark.parametrize("estimator", ESTIMATORS)
@given(rewards=rewards_st, ids=ids_st, keep=masks_st)
def test_matches_the_grouping_rule_on_ragged_groups(estimator, rewards, ids, keep) -> None:
    got = RAGGED[estimator](jnp.asarray(rewards), jnp.asarray(ids), jnp.asarray(keep))
    want = reference(rewards, ids, keep, estimator)
    # Equal rewards make a zero deviation; summation order then leaves ~1e-16 / 1e-6.
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-9)
    assert (np.asarray(got)[~keep] == 0.0).all()


@pytest.mark.parametrize("estimator", ESTIMATORS)
@given(rewards=rewards_st, ids=ids_st, keep=masks_st, data=st.data())
def test_order_and_id_values_do_not_matter(estimator, rewards, ids, keep, data) -> None:
    order = np.asarray(data.draw(st.permutations(range(B))))
    relabel = {v: 7 - 100 * int(v) for v in np.unique(ids)}  # reverses the ids' order
    fn = RAGGED[estimator]
    base = np.asarray(fn(jnp.asarray(rewards), jnp.asarray(ids), jnp.asarray(keep)))
    moved = fn(jnp.asarray(rewards[order]), jnp.asarray(ids[order]), jnp.asarray(keep[order]))
    np.testing.assert_allclose(np.asarray(moved), base[order], rtol=1e-12, atol=1e-9)
    renamed = fn(jnp.asarray(rewards), jnp.asarray([relabel[v] for v in ids]), jnp.asarray(keep))
    np.testing.assert_allclose(np.asarray(renamed), base, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@given(
    rewards=rewards_st,
    ids=ids_st,
    keep=masks_st,
    other_ids=ids_st,
    bad=st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_dropped_members_are_absent(estimator, rewards, ids, keep, other_ids, bad) -> None:
    fn = RAGGED[estimator]
    clean = np.asarray(fn(jnp.asarray(rewards), jnp.asarray(ids), jnp.asarray(keep)))
    # Whatever a dropped member holds and whichever group it names, nothing changes.
    dirty = np.where(keep, rewards, bad)
    moved = np.where(keep, ids, other_ids)
    poisoned = np.asarray(fn(jnp.asarray(dirty), jnp.asarray(moved), jnp.asarray(keep)))
    np.testing.assert_array_equal(poisoned, clean)
    assert np.isfinite(poisoned).all()
    assert (poisoned[~keep] == 0.0).all()


@given(
    grouped=hnp.arrays(np.float64, (12,), elements=st.floats(-4.0, 4.0, width=64)),
    group=st.sampled_from([1, 2, 3, 4, 6, 12]),
)
def test_equal_adjacent_groups_give_group_and_rloo_advantage(grouped, group) -> None:
    rewards = jnp.asarray(grouped)
    ids = jnp.arange(12) // group
    pairs = [
        ("group", rl.group_advantage(rewards, group)),
        ("mean", rl.group_advantage(rewards, group, normalise_by_std=False)),
        ("rloo", rl.rloo_advantage(rewards, group)),
    ]
    for estimator, want in pairs:
        got = rl.ragged_group_advantage(rewards, ids, estimator=estimator)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_verl_grpo_rule_exactly(dtype) -> None:
    rewards = jnp.asarray([1.0, 0.0, 1.0, 3.0, 2.0, 2.0, 0.5], dtype)
    ids = jnp.asarray([0, 0, 0, 1, 2, 2, 3])
    got = np.asarray(rl.ragged_group_advantage(rewards, ids))
    assert got.dtype == dtype
    a = np.asarray([1.0, 0.0, 1.0])
    want = (a - a.mean()) / (a.std(ddof=1) + 1e-6)  # unbiased deviation + 1e-6
    np.testing.assert_allclose(got[:3], want, rtol=1e-6 if dtype == jnp.float32 else 1e-13)
    # A group of one: mean 0, deviation 1, so r / (1 + 1e-6), formed as group=1 forms it.
    single = rl.group_advantage(jnp.asarray([3.0, 0.5], dtype), 1)
    assert got[3] == np.asarray(single)[0] and got[6] == np.asarray(single)[1]
    assert got[3] != 3.0
    assert got[4:6].tolist() == [0.0, 0.0]  # zero spread gives zeros
    mean = np.asarray(rl.ragged_group_advantage(rewards, ids, estimator="mean"))
    assert mean[3] == 3.0 and mean[6] == 0.5
    rloo = np.asarray(rl.ragged_group_advantage(rewards, ids, estimator="rloo"))
    assert rloo[:3].tolist() == [0.5, -1.0, 0.5] and rloo[3] == 3.0


def test_float32_matches_group_advantage_and_bfloat16_keeps_its_dtype() -> None:
    values = np.random.default_rng(3).normal(size=24)
    rewards = jnp.asarray(values, jnp.float32)
    ids = jnp.arange(24) // 8
    got = rl.ragged_group_advantage(rewards, ids)
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(rl.group_advantage(rewards, 8)), rtol=2e-6, atol=1e-6
    )
    half = rl.ragged_group_advantage(rewards.astype(jnp.bfloat16), ids)
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float32), np.asarray(got), atol=0.05)


def test_jits_with_traced_ids_and_mask_and_static_estimator() -> None:
    fn = jax.jit(rl.ragged_group_advantage, static_argnames="estimator")
    rewards = jnp.asarray([1.0, 2.0, 4.0, 8.0])
    first = fn(rewards, jnp.asarray([0, 0, 1, 1]), jnp.asarray([1, 1, 1, 1]), "mean")
    second = fn(rewards, jnp.asarray([0, 1, 1, 1]), jnp.asarray([1, 1, 1, 0]), "mean")
    assert np.asarray(first).tolist() == [-0.5, 0.5, -2.0, 2.0]
    assert np.asarray(second).tolist() == [1.0, -1.0, 1.0, 0.0]
    assert rl.ragged_group_advantage(jnp.zeros((0,)), jnp.zeros((0,), int)).shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"estimator": "grpo"}, ValueError, "estimator: expected one of ('group', 'mean', 'rloo')"),
        ({"eps": -1.0}, ValueError, "eps: expected a non-negative number, got -1.0"),
        ({"group_ids": jnp.zeros((4,))}, TypeError, "group_ids: expected integer group ids"),
        ({"group_ids": jnp.zeros((3,), int)}, ValueError, "group_ids: expected the shape"),
        ({"mask": jnp.ones((2, 2))}, ValueError, "mask: expected the shape of rewards (4,)"),
        ({"rewards": jnp.zeros((2, 2))}, ValueError, "rewards: expected shape [B]"),
        ({"rewards": jnp.zeros((4,), int)}, TypeError, "rewards: expected a floating-point"),
    ],
)
def test_bad_input_is_named(kwargs, error, message) -> None:
    args = {"rewards": jnp.zeros((4,)), "group_ids": jnp.zeros((4,), int)} | kwargs
    with pytest.raises(error) as raised:
        rl.ragged_group_advantage(**args)
    assert message in str(raised.value)

"""PPO's private parts: the two-subtree variables tree and the critic's value loss.

``PPOObjective`` is tested end to end (and against verl's fixtures) in ``test_ppo.py``; these
pin the pieces it is built from and the names ``dew.objectives.rl.ppo`` re-exports.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl import _ppo_critic, _ppo_tree, ppo


def test_ppo_reexports_the_critic_half() -> None:
    assert ppo.packed_values is _ppo_critic.packed_values
    assert ppo.value_loss_terms is _ppo_critic.value_loss_terms
    assert set(ppo.__all__) == {"PPOObjective", "packed_values", "value_loss_terms"}


def test_subtree_and_join_are_inverse() -> None:
    policy = {"params": {"w": 1}, "cache": {"k": 2}}
    critic = {"params": {"v": 3}}
    tree = _ppo_tree.join(policy, critic)
    assert tree == {
        "cache": {"policy": {"k": 2}},
        "params": {"critic": {"v": 3}, "policy": {"w": 1}},
    }
    assert _ppo_tree.subtree(tree, _ppo_tree.POLICY) == policy
    assert _ppo_tree.subtree(tree, _ppo_tree.CRITIC) == critic


def test_subtree_errors_name_the_field() -> None:
    with pytest.raises(
        ValueError, match="variables: expected a mapping with a 'params' collection, got list"
    ):
        _ppo_tree.subtree([], "policy")
    message = (
        "variables['params']['critic']: missing; a PPO variables tree holds 'policy' and "
        "'critic' subtrees, got ['policy']"
    )
    with pytest.raises(KeyError, match=re.escape(message)):
        _ppo_tree.subtree({"params": {"policy": {}}}, "critic")


def test_value_loss_terms_follow_the_clipped_formula_and_ignore_padding() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(size=(2, 5)).astype(np.float32)
    returns = rng.normal(size=(2, 5)).astype(np.float32)
    old = rng.normal(size=(2, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    returns[0, 4] = np.nan  # padding: must reach nothing
    values[0, 3] = np.inf
    terms, metrics = _ppo_critic.value_loss_terms(
        jnp.asarray(values), {"returns": jnp.asarray(returns), "old_values": jnp.asarray(old)},
        jnp.asarray(mask), 0.2,
    )  # fmt: skip
    clipped = np.clip(values, old - 0.2, old + 0.2)
    want = 0.5 * np.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    np.testing.assert_allclose(np.asarray(terms)[mask], want[mask], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(terms)[~mask], 0.0)
    np.testing.assert_allclose(float(metrics["critic/loss"]), want[mask].mean(), rtol=1e-6)
    np.testing.assert_allclose(
        float(metrics["critic/error"]), ((values - returns) ** 2)[mask].mean(), rtol=1e-6
    )
    share = ((clipped - returns) ** 2 > (values - returns) ** 2)[mask].mean()
    np.testing.assert_allclose(float(metrics["critic/clip_fraction"]), share, rtol=1e-6)
    assert all(np.isfinite(float(v)) for v in metrics.values())

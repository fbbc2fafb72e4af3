"""dew.rl.ragged_group_advantage against verl 0.9.1 on ragged groups.

Fixture: ``tests/fixtures/agentic/chains.npz`` (recorded by ``tools/parity_agentic.py`` in the
reference environment; see its JSON sidecar ``agentic.json``): fourteen rewards in groups of
4, 3, 1, 2 and 4 (one group with equal rewards) and verl's ``compute_grpo_outcome_advantage``
(epsilon 1e-6, with and without ``norm_adv_by_std_in_grpo``) and
``compute_rloo_outcome_advantage`` over them. Here the same rewards also come shuffled and
with dropped members mixed in, which verl cannot express and must not change the answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from dew import rl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agentic"
SIDECAR = json.loads((FIXTURES / "agentic.json").read_text())
CHAINS = dict(np.load(FIXTURES / "chains.npz"))
CASES = [("group", "adv_grpo"), ("mean", "adv_grpo_mean"), ("rloo", "adv_rloo")]
# verl computes in float32; the largest difference seen is one float32 ulp of values near 1.
TOL = 3e-7


def test_the_fixture_is_ragged_and_recorded_from_verl() -> None:
    assert SIDECAR["advantages"]["adv_grpo"].startswith("compute_grpo_outcome_advantage")
    assert SIDECAR["advantages"]["adv_rloo"] == "compute_rloo_outcome_advantage"
    sizes = np.bincount(CHAINS["group"])
    assert sorted(sizes.tolist()) == [1, 2, 3, 4, 4]


@pytest.mark.parametrize(("estimator", "key"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_verl_on_ragged_groups(estimator: str, key: str, dtype: type) -> None:
    got = rl.ragged_group_advantage(
        jnp.asarray(CHAINS["rewards"].astype(dtype)),
        jnp.asarray(CHAINS["group"]),
        estimator=estimator,
    )
    np.testing.assert_allclose(np.asarray(got, np.float64), CHAINS[key], rtol=0, atol=TOL)


@pytest.mark.parametrize(("estimator", "key"), CASES)
def test_matches_verl_shuffled_with_dropped_members(estimator: str, key: str) -> None:
    rng = np.random.default_rng(5)
    n = CHAINS["rewards"].size
    rewards = np.concatenate([CHAINS["rewards"], np.full(4, np.nan, np.float32)])
    groups = np.concatenate([CHAINS["group"], np.array([0, 2, 9, 3], CHAINS["group"].dtype)])
    keep = np.arange(n + 4) < n
    order = rng.permutation(n + 4)
    got = rl.ragged_group_advantage(
        jnp.asarray(rewards[order]),
        jnp.asarray(groups[order] * 31 + 5),  # any integer ids name the groups
        jnp.asarray(keep[order]),
        estimator=estimator,
    )
    want = np.concatenate([CHAINS[key], np.zeros(4, np.float32)])[order]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=TOL)

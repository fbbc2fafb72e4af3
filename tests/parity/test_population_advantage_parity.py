"""dew.rl.group_advantage(ddof=0), Flow-GRPO's population deviation, against recorded numbers.

Flow-GRPO (github.com/yifan123/flow_grpo, ``flow_grpo/stat_tracking.py``,
``PerPromptStatTracker.update``) normalises a prompt's rewards in float64 numpy as
``(r - mean) / (np.std(r) + 1e-4)``: the population deviation. verl 0.9.1
(``compute_grpo_outcome_advantage``) divides by the unbiased deviation plus 1e-6. The
fixture ``tests/fixtures/rl/grpo_outcome_g4_std_f64.npz`` (recorded from verl by
``tools/parity_rl.py``) gives rewards in groups of four and verl's advantages over them.

Checked here: the population option against numpy's ``np.std`` formula on the recorded
rewards, and against verl's recorded advantages rescaled from one deviation to the other
(both are the same centred rewards over different denominators), so the option shares its
centring with the verl port the fixture pins and differs from it only in the deviation.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import rl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rl"
FLOW_EPS = 1e-4  # Flow-GRPO's epsilon
VERL_EPS = 1e-6


def recorded(stem: str) -> tuple[np.ndarray, np.ndarray, int, dict]:
    """``[B]`` rewards, verl's ``[B]`` advantages, the group size and the sidecar."""
    with np.load(FIXTURES / f"{stem}.npz") as data:
        token_rewards = data["in__token_level_rewards"]
        mask = data["in__response_mask"] != 0
        tokens = data["out__advantages"]
    side = json.loads((FIXTURES / f"{stem}.json").read_text())
    rewards = np.where(mask, token_rewards, 0.0).sum(axis=1)
    first = mask.argmax(axis=1)  # verl broadcasts one advantage over a row's kept tokens
    assert mask.any(axis=1).all()
    advantages = tokens[np.arange(tokens.shape[0]), first]
    return rewards, advantages, int(side["options"]["group"]), side


def test_the_fixture_is_verls_grouped_advantage() -> None:
    _, _, group, side = recorded("grpo_outcome_g4_std_f64")
    assert side["package"] == "verl" and side["version"] == "0.9.1"
    assert side["function"] == "verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage"
    assert side["options"]["epsilon"] == VERL_EPS and group == 4


def test_population_option_is_numpys_population_formula_on_the_fixture() -> None:
    rewards, _, group, _ = recorded("grpo_outcome_g4_std_f64")
    with jax.enable_x64(True):
        got = np.asarray(rl.group_advantage(jnp.asarray(rewards), group, eps=FLOW_EPS, ddof=0))
    assert got.dtype == np.float64
    groups = rewards.reshape(-1, group)
    want = (groups - groups.mean(1, keepdims=True)) / (np.std(groups, 1, keepdims=True) + FLOW_EPS)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("stem", ["grpo_outcome_g4_std_f64", "grpo_outcome_g4_std_f32"])
def test_population_option_is_verls_recorded_advantage_over_another_deviation(stem: str) -> None:
    rewards, verl, group, side = recorded(stem)
    x64 = side["dtype"] == "float64"
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        got = np.asarray(
            rl.group_advantage(jnp.asarray(rewards, dtype), group, eps=FLOW_EPS, ddof=0)
        ).astype(np.float64)
    groups = rewards.astype(np.float64).reshape(-1, group)
    unbiased = np.std(groups, 1, ddof=1, keepdims=True)
    population = np.std(groups, 1, keepdims=True)
    rescaled = verl.reshape(-1, group) * (unbiased + VERL_EPS) / (population + FLOW_EPS)
    rtol = 1e-12 if x64 else 2e-6
    np.testing.assert_allclose(got, rescaled.reshape(-1), rtol=rtol, atol=rtol)
    # and the default stays verl's unbiased rule on the same numbers
    with jax.enable_x64(x64):
        default = np.asarray(rl.group_advantage(jnp.asarray(rewards, dtype), group))
    np.testing.assert_allclose(default, verl, rtol=rtol, atol=rtol)

"""FlowRollout's batch and FlowGRPOObjective's loss, gradient, reference and corrections."""

from __future__ import annotations

import itertools
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dew.rl as rl
from dew import Trainer
from dew.data import Dataset
from dew.flow import (
    Field,
    FlowGRPOObjective,
    FlowRollout,
    InputSpec,
    LabelEncoder,
    RewardError,
    SimpleDiT,
    group_advantages,
    presets,
)

INPUTS = InputSpec(Field("image", (4, 4, 1)), Field("label", (), "int32"))
DIT = SimpleDiT(output_channels=1, patch_size=2, emb_features=8, num_layers=1, num_heads=2,
                mlp_ratio=2)  # fmt: skip
ENCODERS = {"label": LabelEncoder(num_classes=2, features=4)}
SOURCE = {"label": np.array([0, 1], np.int32)}


def mixed_reward(images, batch):
    """Group 0 (label 0) all score 1.0; group 1 scores its brightness."""
    return np.where(batch["label"] == 0, 1.0, images.mean(axis=(1, 2, 3)).astype(np.float64) + 1e-9)


def moved_variables(objective: FlowGRPOObjective) -> dict:
    variables = objective.init(jax.random.key(0))
    flat = flax.traverse_util.flatten_dict(variables["params"])
    rng = np.random.default_rng(1)
    flat = {k: (v + rng.normal(0, 0.2, v.shape)).astype(np.float32) for k, v in flat.items()}
    return {"params": flax.traverse_util.unflatten_dict(flat)}


@pytest.fixture(scope="module")
def setup():
    objective = FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, guidance=None, beta=0.0,
                                  steps=5, encoders=ENCODERS)  # fmt: skip
    variables = moved_variables(objective)
    rollout = FlowRollout(objective, mixed_reward, groups=4, steps=5, train_steps=3)
    batch = rollout(variables, SOURCE, jax.random.key(7))
    return objective, variables, rollout, batch


def test_group_advantages_population_std() -> None:
    r = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    a = group_advantages(r, 4)
    std = np.std([1.0, 2.0, 3.0, 4.0])  # ddof 0
    np.testing.assert_allclose(a[:4], (r[:4] - 2.5) / (std + 1e-4))
    np.testing.assert_array_equal(a[4:], 0.0)
    assert a.dtype == np.float64


def test_group_advantages_are_dew_rl_population_option_in_float64() -> None:
    """FlowRollout's rule is dew.rl.group_advantage(ddof=0, eps=1e-4), in float64 with x64 off."""
    assert not jax.config.jax_enable_x64
    # a spread of 1e-9 around 1.0 vanishes in float32 (all equal: zeros); float64 keeps it
    r = np.array([1.0 + 2e-9, 1.0, 1.0 - 1e-9, 1.0, 0.0, 1.0, 2.0, 3.0])
    a = group_advantages(r, 4)
    assert a.dtype == np.float64 and not jax.config.jax_enable_x64
    groups = r.reshape(2, 4)
    want = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(a, want.reshape(-1), rtol=1e-9)
    assert np.abs(a[:4]).max() > 1e-6
    with jax.enable_x64(True):
        direct = rl.group_advantage(jnp.asarray(r), 4, eps=1e-4, ddof=0)
    np.testing.assert_array_equal(a, np.asarray(direct))
    with pytest.raises(ValueError, match="rewards: expected a length divisible by group=3"):
        group_advantages(r, 3)


def test_rollout_batch_layout(setup) -> None:
    objective, _, rollout, batch = setup
    n, s = 8, 3
    np.testing.assert_array_equal(batch["label"], [0, 0, 0, 0, 1, 1, 1, 1])  # contiguous groups
    assert batch["states"].shape == (n, s, 4, 4, 1) and batch["next_states"].shape == (
        n,
        s,
        4,
        4,
        1,
    )
    assert batch["rewards"].dtype == np.float64 and batch["advantages"].dtype == np.float32
    np.testing.assert_array_equal(batch["rewards"], rollout.last_rewards)
    np.testing.assert_allclose(
        batch["advantages"][:, 0], group_advantages(batch["rewards"], 4).astype(np.float32)
    )
    # the equal-reward group stays, with its transitions masked out
    np.testing.assert_array_equal(batch["transition_mask"][:4], 0.0)
    np.testing.assert_array_equal(batch["transition_mask"][4:], 1.0)
    times = np.asarray(objective.process.grid(5))
    np.testing.assert_allclose(batch["times"][0], times[:3])
    np.testing.assert_allclose(batch["next_times"][0], times[1:4])
    np.testing.assert_array_equal(batch["states"][:, 1:], batch["next_states"][:, :-1])
    assert set(rollout.last_timings) == {"sampling", "rewards", "batch"}
    # the recorded densities are the live policy's own
    np.testing.assert_allclose(
        objective.log_densities(setup[1], batch), batch["behavior_log_probs"], atol=1e-5
    )


def test_on_policy_gradient_is_the_policy_gradient(setup) -> None:
    objective, variables, _, batch = setup

    def dew_loss(params):
        ls, w, _ = objective.loss({"params": params}, batch, jax.random.key(0))
        return ls / w

    def by_hand(params):
        lp = objective.log_densities({"params": params}, batch)
        mask = batch["transition_mask"] > 0
        ratio = jnp.exp(lp - batch["behavior_log_probs"])
        terms = -jnp.clip(batch["advantages"], -5, 5) * ratio
        return jnp.sum(jnp.where(mask, terms, 0.0)) / jnp.sum(mask)

    got = jax.grad(dew_loss)(variables["params"])
    want = jax.grad(by_hand)(variables["params"])
    for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, h, atol=1e-6, rtol=1e-4)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(got)) > 0
    _, weight, metrics = objective.loss(variables, batch, jax.random.key(0))
    assert float(weight) == 4 * 3 and float(metrics["transitions"]) == 12


def test_zero_advantage_batch_has_no_weight(setup) -> None:
    objective, variables, _, batch = setup
    flat = {**batch, "transition_mask": np.zeros_like(batch["transition_mask"])}
    loss_sum, weight, _ = objective.loss(variables, flat, jax.random.key(0))
    assert float(weight) == 0 and float(loss_sum) == 0


def test_corrections_follow_the_lm_path(setup) -> None:
    _, variables, _, batch = setup
    capped = FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, steps=5, encoders=ENCODERS,
                               behavior_importance=2.0)  # fmt: skip
    with pytest.raises(ValueError, match="a TIS cap needs old_log_probs"):
        capped.loss(variables, batch, jax.random.key(0))
    rescoring = FlowRollout(capped, mixed_reward, groups=4, steps=5, train_steps=3, rescore=True)
    rescored = rescoring(variables, SOURCE, jax.random.key(7))
    assert "old_log_probs" in rescored
    _, w, metrics = capped.loss(variables, rescored, jax.random.key(0))
    assert float(w) == 12 and "mismatch/ess" in metrics
    band = FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, steps=5, encoders=ENCODERS,
                             behavior_importance=(0.5, 2.0))  # fmt: skip
    shifted = {**batch, "behavior_log_probs": batch["behavior_log_probs"] + 5.0}
    _, w, metrics = band.loss(variables, shifted, jax.random.key(0))
    assert float(w) == 0 and float(metrics["mask/behavior_band"]) == 1.0
    with pytest.raises(ValueError, match="ema_decay: Flow-GRPO fixes it at None"):
        FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, ema_decay=0.9)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"epsilon_low": -0.1}, "epsilon_low: expected a finite value >= 0, got -0.1"),
        ({"epsilon_high": float("inf")}, "epsilon_high: expected a finite value >= 0, got inf"),
        ({"behavior_importance": 0.0}, "behavior_importance: expected a positive finite cap"),
        ({"behavior_importance": (2.0, 0.5)}, "behavior_importance: expected 0 < low <= high"),
        ({"behavior_importance": True}, "behavior_importance: expected None, a cap or"),
    ],
)
def test_loss_options_are_checked_when_built(options, message) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, steps=5, encoders=ENCODERS, **options)


def test_loss_options_are_built_once() -> None:
    objective = FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, steps=5, encoders=ENCODERS,
                                  epsilon_low=1e-3, behavior_importance=[0.5, 2])  # fmt: skip
    options = objective.loss_options
    assert (options.policy_loss, options.aggregation, options.dual_clip) == (
        "ppo",
        "token-mean",
        None,
    )
    assert options.epsilon_low == objective.epsilon_low == 1e-3
    assert options.behavior_importance == objective.behavior_importance == (0.5, 2.0)


def test_reward_errors_name_the_problem(setup) -> None:
    objective, variables, _, _ = setup
    short = FlowRollout(objective, lambda images, batch: np.zeros(3), groups=4, steps=5)
    with pytest.raises(RewardError, match=r"one score per sample, shape \[8\], got \[3\]"):
        short(variables, SOURCE, jax.random.key(0))
    nan = FlowRollout(objective, lambda images, batch: np.full(8, np.nan), groups=4, steps=5)
    with pytest.raises(RewardError, match="expected finite scores, sample 0 got nan"):
        nan(variables, SOURCE, jax.random.key(0))
    with pytest.raises(ValueError, match=r"train_steps: expected at most the 4 stochastic"):
        FlowRollout(objective, mixed_reward, groups=4, steps=5, train_steps=5)
    with pytest.raises(ValueError, match="groups: expected an integer >= 2"):
        FlowRollout(objective, mixed_reward, groups=1, steps=5)


def test_beta_freezes_the_starting_policy() -> None:
    objective = FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, beta=0.5, steps=4,
                                  encoders=ENCODERS, epsilon_low=0.2, epsilon_high=0.2)  # fmt: skip
    start = moved_variables(objective)
    objective.pretrained = start
    rollout = FlowRollout(objective, mixed_reward, groups=4, steps=4)
    data = Dataset(train=lambda p: itertools.repeat(SOURCE), val=None, records=2, batch=2)
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), rollout=rollout)
    state = trainer.fit(data, steps=2)
    assert int(state.updates) == 2
    for e, s in zip(jax.tree.leaves(state.ema), jax.tree.leaves(start)):
        np.testing.assert_array_equal(e, s)
    moved = any(
        not np.allclose(p, s) for p, s in zip(jax.tree.leaves(state.params), jax.tree.leaves(start))
    )
    assert moved
    batch = rollout(state.params, SOURCE, jax.random.key(1))
    _, _, metrics = objective.loss(state.params, batch, jax.random.key(0), state.ema)
    assert float(metrics["kl/reference"]) > 0
    _, _, same = objective.loss(state.params, batch, jax.random.key(0), state.params)
    assert float(same["kl/reference"]) == 0
    with pytest.raises(ValueError, match="beta > 0 needs the frozen starting policy"):
        objective.loss(state.params, batch, jax.random.key(0), None)
    # evaluation and previews read the live policy, not the frozen one
    images = {"image": np.zeros((2, 4, 4, 1), np.uint8), **SOURCE}
    live = objective.evaluate(state.params, images, jax.random.key(4))
    frozen = objective.evaluate(state.ema, images, jax.random.key(4))
    assert float(live["weight"]) == 2 and float(live["loss"]) != float(frozen["loss"])
    shown = objective.preview(state.params, SOURCE, jax.random.key(5))
    assert shown.shape == (2, 4, 4, 1)
    assert not np.allclose(shown, objective.preview(state.ema, SOURCE, jax.random.key(5)))

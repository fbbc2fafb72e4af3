"""GRPO's policy loss as composed steps: options checked once, the steps agree with the whole."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl._fused_policy import fused_applies
from dew.objectives.rl.policy_loss import (
    PolicyLossOptions,
    aggregate,
    compute_policy_loss,
    correct,
    policy_loss_from_log_probs,
    read_inputs,
    surrogate,
)


def _batch(seed: int = 0) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    rng = np.random.default_rng(seed)
    shape = (2, 6)
    segments = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    response = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]], np.int32)
    batch = {
        "text_segment_ids": jnp.asarray(segments),
        "response_mask": jnp.asarray(response),
        "session_index": jnp.asarray(np.where(response > 0, [[0], [1]], -1), jnp.int32),
        "advantages": jnp.asarray(rng.standard_normal(shape), jnp.float32),
        "behavior_log_probs": jnp.asarray(-rng.uniform(0.1, 2.0, shape), jnp.float32),
        "old_log_probs": jnp.asarray(-rng.uniform(0.1, 2.0, shape), jnp.float32),
    }
    return jnp.asarray(-rng.uniform(0.1, 2.0, shape), jnp.float32), batch


CASES = [
    {},
    {"policy_loss": "gspo", "aggregation": "session-mean"},
    {"policy_loss": "cispo", "behavior_importance": 2.0},
    {"behavior_importance": (0.5, 2.0), "sequence_mask": (0.2, 5.0), "beta": 0.1},
    {"sequence_mask": (0.2, 5.0), "beta": 0.1, "dual_clip": None},
    {"beta": 0.1, "behavior_importance": (0.5, 2.0)},  # bypass band: fused, keep shrinks
    {"beta": 0.1, "kl_estimator": "abs"},  # not k3: the fused pass does not apply
    {"kl_estimator": "mse"},  # beta 0: no KL term, fused
]
#: compute_policy_loss runs steps 3-4 as dew.rl.policy_loss for these: float rounding apart.
FUSED = {0, 4, 5, 7}


def _same(got: Any, want: Any, fused: bool) -> None:
    if fused:  # one sum times the count, and kl/reference without masked_mean's 1e-8
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_steps_in_order_are_the_loss(case: int) -> None:
    options, fused = CASES[case], case in FUSED
    log_probs, batch = _batch()
    if case == 5:  # bypass mode: no old_log_probs
        batch = {k: v for k, v in batch.items() if k != "old_log_probs"}
    ref = log_probs - 0.1
    whole = policy_loss_from_log_probs(log_probs, batch, ref_log_probs=ref, **options)
    opts = PolicyLossOptions(**options)
    composed = compute_policy_loss(log_probs, batch, opts, ref)
    inputs = read_inputs(log_probs, batch, opts)
    keep, weights, metrics = correct(inputs, opts)
    terms, per_token, more = surrogate(log_probs, inputs, keep, weights, opts, ref)
    loss_sum, weight, last = aggregate(terms, per_token, keep, batch, opts, log_probs.dtype)
    assert opts.policy_loss != "ppo" or fused_applies(opts, weights) == fused
    for result, close in (
        (composed, False),
        ((loss_sum, weight, {**metrics, **more, **last}), fused),
    ):
        _same(result[0], whole[0], close)
        _same(result[1], whole[1], close)
        assert sorted(result[2]) == sorted(whole[2])
        for name in whole[2]:
            _same(result[2][name], whole[2][name], close)
    assert np.isfinite(float(whole[0]))

    def by_steps(lp: jax.Array) -> jax.Array:
        inputs = read_inputs(lp, batch, opts)
        keep, weights, _ = correct(inputs, opts)
        terms, per_token, _ = surrogate(lp, inputs, keep, weights, opts, ref)
        return aggregate(terms, per_token, keep, batch, opts, lp.dtype)[0]

    grad = jax.jit(jax.grad(lambda lp: compute_policy_loss(lp, batch, opts, ref)[0]))(log_probs)
    want = jax.jit(jax.grad(by_steps))(log_probs)
    assert float(jnp.max(jnp.abs(want))) > 0
    _same(grad, want, fused)


def test_fused_path_with_nothing_kept_gives_zero_loss_and_gradient() -> None:
    log_probs, batch = _batch()
    batch = {**batch, "response_mask": jnp.zeros_like(batch["response_mask"])}
    opts = PolicyLossOptions(beta=0.1)
    ref = log_probs - 0.1

    def loss(lp: jax.Array) -> jax.Array:
        return compute_policy_loss(lp, batch, opts, ref)[0]

    value, grad = jax.jit(jax.value_and_grad(loss))(log_probs)
    metrics = compute_policy_loss(log_probs, batch, opts, ref)[2]
    assert float(value) == 0.0 and float(jnp.max(jnp.abs(grad))) == 0.0
    assert float(metrics["policy/loss"]) == 0.0 and float(metrics["kl/reference"]) == 0.0


def test_options_are_normalised_once_and_frozen() -> None:
    opts = PolicyLossOptions(beta=1, epsilon_low=0, dual_clip=2, sequence_mask=[0.5, 2])
    assert opts.beta == 1.0 and isinstance(opts.beta, float)
    assert opts.dual_clip == 2.0 and opts.sequence_mask == (0.5, 2.0)
    assert opts.corrected and not PolicyLossOptions().corrected
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.beta = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="aggregation: expected one of"):
        PolicyLossOptions(aggregation="seq-mean")
    with pytest.raises(ValueError, match="dual_clip: expected None or a value above 1.0"):
        PolicyLossOptions(dual_clip=0.5)


def test_the_objective_keeps_one_checked_options_object() -> None:
    from dew.objectives.rl.grpo import GRPOObjective

    objective = GRPOObjective(object(), seq_len=5, beta=0.2, behavior_importance=[0.5, 2.0])
    assert isinstance(objective.loss_options, PolicyLossOptions)
    assert objective.beta == 0.2 and objective.behavior_importance == (0.5, 2.0)
    assert objective.options() == dataclasses.asdict(objective.loss_options)
    with pytest.raises(AttributeError):
        objective.beta = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "aggregation",
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
)
def test_an_aggregation_adds_up_over_microbatches(aggregation: str) -> None:
    """(loss_sum, weight) of row halves summed: the whole batch's loss and gradient, as the
    Trainer sums micro-batches (or devices) before dividing; no session is split here."""
    log_probs, batch = _batch(3)
    ref = log_probs - 0.2
    entropy = jnp.abs(log_probs) * 0.5
    factor = 16.0 if aggregation == "seq-mean-token-sum-norm" else None
    opts = PolicyLossOptions(
        aggregation=aggregation, beta=0.1, entropy_coeff=0.01, loss_scale_factor=factor
    )

    def loss_of(rows: slice):
        def f(lp: jax.Array) -> tuple[jax.Array, jax.Array]:
            part = {k: v[rows] for k, v in batch.items()}
            loss_sum, weight, _ = compute_policy_loss(lp[rows], part, opts, ref[rows],
                                                      entropy[rows])  # fmt: skip
            return loss_sum, weight

        return jax.value_and_grad(f, has_aux=True)(log_probs)

    (whole_sum, whole_weight), whole_grad = loss_of(slice(None))
    (s0, w0), g0 = loss_of(slice(0, 1))
    (s1, w1), g1 = loss_of(slice(1, 2))
    assert float(w0 + w1) == float(whole_weight) > 0
    np.testing.assert_allclose(
        float((s0 + s1) / (w0 + w1)), float(whole_sum / whole_weight), rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(g0 + g1), np.asarray(whole_grad), rtol=1e-6, atol=1e-8)


def test_seq_mean_token_sum_norm_is_seq_mean_token_sum_over_its_factor() -> None:
    log_probs, batch = _batch(4)
    ref, entropy = log_probs - 0.2, jnp.abs(log_probs)
    common = {"beta": 0.1, "entropy_coeff": 0.01}
    plain = compute_policy_loss(
        log_probs, batch, PolicyLossOptions(aggregation="seq-mean-token-sum", **common), ref,
        entropy,
    )  # fmt: skip
    normed = compute_policy_loss(
        log_probs, batch,
        PolicyLossOptions(aggregation="seq-mean-token-sum-norm", loss_scale_factor=8, **common),
        ref, entropy,
    )  # fmt: skip
    assert float(normed[1]) == float(plain[1])  # the same weight: the number of sessions
    np.testing.assert_allclose(float(normed[0]), float(plain[0]) / 8, rtol=1e-6)
    for name in ("policy/loss", "policy/entropy"):
        np.testing.assert_allclose(float(normed[2][name]), float(plain[2][name]) / 8, rtol=1e-6)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"aggregation": "seq-mean-token-sum-norm"}, "^loss_scale_factor: aggregation 'seq-mean"),
        ({"aggregation": "seq-mean-token-sum-norm", "loss_scale_factor": 0}, "^loss_scale_f"),
        ({"loss_scale_factor": 16}, "^loss_scale_factor: only aggregation 'seq-mean-token-sum-n"),
        ({"entropy_coeff": float("inf")}, "^entropy_coeff: expected a finite number"),
        ({"kl_estimator": "k2+"}, "^kl_estimator: expected one of"),
    ],
)
def test_new_options_are_refused_naming_the_option(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolicyLossOptions(**options)

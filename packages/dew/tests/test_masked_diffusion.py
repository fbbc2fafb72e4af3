"""Masked diffusion: MDLM's schedules, times, masking, SUBS, the loss and the objective."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.objectives import MaskedDiffusionObjective
from dew.objectives.diffusion import (
    CosineSchedule,
    LogLinearSchedule,
    diffusion_nll,
    mask_tokens,
    sample_times,
    schedule_named,
    subs_log_probs,
)
from dew.testing import tiny_decoder

V, L = 12, 8  # ids 0..10 are real, 11 is the mask


def _model(**overrides):  # noqa: ANN202
    return tiny_decoder(V, L, **overrides)


# -- schedules, times, masking, SUBS ----------------------------------------------------------


def test_schedules_match_their_formulas() -> None:
    t = jnp.array([0.1, 0.5, 0.9], jnp.float32)
    eps = 1e-3
    ll = LogLinearSchedule(eps)
    np.testing.assert_allclose(ll.sigma(t), -np.log1p(-(1 - eps) * np.asarray(t)), rtol=1e-6)
    np.testing.assert_allclose(ll.move_chance(t), (1 - eps) * np.asarray(t), rtol=1e-5)
    np.testing.assert_allclose(ll.weight(t), 1 / np.asarray(t), rtol=1e-5)
    cos = CosineSchedule(eps)
    c = np.cos(np.asarray(t, np.float64) * math.pi / 2)
    np.testing.assert_allclose(cos.sigma(t), -np.log(eps + (1 - eps) * c), rtol=1e-5)
    grad = jax.vmap(jax.grad(cos.sigma))(t)  # the rate is the derivative of sigma
    np.testing.assert_allclose(cos.rate(t), grad, rtol=1e-4)
    grad = jax.vmap(jax.grad(ll.sigma))(t)
    np.testing.assert_allclose(ll.rate(t), grad, rtol=1e-5)
    with pytest.raises(ValueError, match="schedule: expected one of"):
        schedule_named("linear")


def test_antithetic_times_fill_one_stratum_each() -> None:
    t = np.asarray(sample_times(jax.random.key(3), 8, eps=1e-3))
    assert t.min() >= 1e-3 and t.max() < 1.0
    strata = np.floor((t - 1e-3) / (1 - 1e-3) * 8).astype(int)
    assert sorted(strata) == list(range(8))


def test_mask_tokens_masks_only_real_positions() -> None:
    tokens = jnp.full((2, 64), 3, jnp.int32)
    real = jnp.arange(64)[None] < jnp.array([[64], [10]])
    noisy, masked = mask_tokens(jax.random.key(0), tokens, jnp.array([1.0, 1.0]), 11, real)
    np.testing.assert_array_equal(np.asarray(masked), np.asarray(real))
    np.testing.assert_array_equal(np.asarray(noisy), np.where(real, 11, 3))
    _, none = mask_tokens(jax.random.key(0), tokens, jnp.array([0.0, 0.0]), 11, real)
    assert not np.asarray(none).any()


def test_subs_carries_unmasked_tokens_and_never_predicts_the_mask() -> None:
    logits = jax.random.normal(jax.random.key(1), (1, 3, V))
    noisy = jnp.array([[11, 4, 11]], jnp.int32)
    lp = np.asarray(subs_log_probs(logits, noisy, 11))
    assert lp[0, 1, 4] == 0.0 and (lp[0, 1, np.arange(V) != 4] == -1e6).all()
    assert np.exp(lp[0, 0]).sum() == pytest.approx(1.0, abs=1e-6)
    assert np.exp(lp[0, 0, 11]) == 0.0
    want = jax.nn.log_softmax(logits[0, 2, :11])
    np.testing.assert_allclose(lp[0, 2, :11], want, atol=1e-6)


def test_diffusion_nll_is_weighted_subs_nll_at_masked_positions() -> None:
    logits = jax.random.normal(jax.random.key(2), (2, 5, V))
    tokens = jax.random.randint(jax.random.key(3), (2, 5), 0, 11)
    masked = jnp.array([[1, 0, 1, 0, 0], [0, 1, 1, 1, 1]], bool)
    times = jnp.array([0.25, 0.8])
    noisy = jnp.where(masked, 11, tokens)
    lp = jnp.take_along_axis(subs_log_probs(logits, noisy, 11), tokens[..., None], -1)[..., 0]
    want = -lp / times[:, None]
    got = diffusion_nll(logits, tokens, masked, times, 11, LogLinearSchedule())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)  # 1/t vs rate/expm1(sigma)
    assert (np.asarray(got)[~np.asarray(masked)] == 0).all()


# -- the objective ----------------------------------------------------------------------------


def test_a_mask_id_among_the_real_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="mask_id: 3 is inside the vocabulary's real tokens"):
        MaskedDiffusionObjective(_model(), L, mask_id=3, real_tokens=11)
    with pytest.raises(ValueError, match="outside the model's vocab_size=12"):
        MaskedDiffusionObjective(_model(), L, mask_id=12, real_tokens=11)


def test_loss_is_finite_and_decreases_on_a_tiny_model() -> None:
    obj = MaskedDiffusionObjective(_model(), L, mask_id=11, real_tokens=11)
    rows = np.tile(np.arange(L + 1) % 11, (8, 1)).astype(np.int32)  # one repeated sentence
    batch = {"text": jnp.asarray(rows)}
    variables = obj.init(jax.random.key(0))
    opt = optax.adam(3e-2)
    state = opt.init(variables["params"])

    def mean_loss(params, key):  # noqa: ANN001, ANN202
        total, weight, metrics = obj.loss({"params": params}, batch, key)
        return total / weight, metrics

    @jax.jit
    def step(params, state, key):  # noqa: ANN001, ANN202
        (value, metrics), grads = jax.value_and_grad(mean_loss, has_aux=True)(params, key)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value, metrics

    params, losses = variables["params"], []
    for i in range(30):
        params, state, value, metrics = step(params, state, jax.random.key(i))
        losses.append(float(value))
    assert np.isfinite(losses).all()
    assert float(metrics["bits_per_token_sum"]) * math.log(2) == pytest.approx(
        losses[-1] * 8 * L, rel=1e-4
    )
    # the same noisings before and after training: the bound falls
    fixed = jnp.stack([jax.random.key(100 + i) for i in range(8)])
    before = jax.vmap(lambda k: mean_loss(variables["params"], k)[0])(fixed)
    after = jax.vmap(lambda k: mean_loss(params, k)[0])(fixed)
    assert float(after.mean()) < 0.9 * float(before.mean())


def test_padding_is_neither_masked_nor_counted() -> None:
    obj = MaskedDiffusionObjective(_model(), L, mask_id=11, real_tokens=11)
    variables = obj.init(jax.random.key(0))
    seg = np.zeros((2, L + 1), np.int32)
    seg[0, :5], seg[1, :] = 1, 2
    batch = {"text": jnp.ones((2, L + 1), jnp.int32), "text_segment_ids": jnp.asarray(seg)}
    loss, real, masked = obj.token_losses(variables, batch, jax.random.key(1))
    assert int(np.asarray(real).sum()) == 5 + L
    assert not np.asarray(masked)[~np.asarray(real)].any()
    total, weight, _ = obj.loss(variables, batch, jax.random.key(1))
    assert float(weight) == 5 + L and np.isfinite(float(total))
    sums = obj.evaluate(variables, batch, jax.random.key(1))
    assert float(sums["loss"]) == pytest.approx(float(total))
    with pytest.raises(ValueError, match=r"expected shape \[B, 9\]"):
        obj.loss(variables, {"text": jnp.ones((2, L), jnp.int32)}, jax.random.key(0))

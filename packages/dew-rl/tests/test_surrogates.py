"""Policy and value surrogates: clipped PPO, GSPO, CISPO, value loss, DPO."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(3)
B, T = 3, 5
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=bool)


def ppo_terms_numpy(log_ratio, adv, lo, hi, c):
    """Dual-clipped PPO per token, written from the formula."""
    ratio = np.exp(log_ratio)
    terms = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi))
    if c is not None:
        terms = np.where(adv < 0, np.minimum(terms, -adv * c), terms)
    return terms


def test_token_log_ratio_clamps_with_torch_gradient() -> None:
    lp = jnp.asarray([25.0, 20.0, 3.0, -20.0, -30.0])
    values = np.asarray(rl.token_log_ratio(lp, jnp.zeros(5)))
    np.testing.assert_array_equal(values, [20.0, 20.0, 3.0, -20.0, -20.0])
    grad = jax.grad(lambda x: rl.token_log_ratio(x, jnp.zeros(5)).sum())(lp)
    # Inside and at the bounds the gradient is one (torch.clamp), beyond them zero.
    np.testing.assert_array_equal(np.asarray(grad), [0.0, 1.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_clipped_surrogate_matches_formula_and_metrics(dual_clip) -> None:
    log_ratio = RNG.normal(0, 0.6, (B, T))
    adv = RNG.normal(0, 1, (B, T))
    log_ratio[0, 0], adv[0, 0] = 2.0, -1.5  # ratio e^2 > 3 with A < 0: the dual clip binds
    loss, metrics = rl.clipped_surrogate(
        jnp.asarray(log_ratio), jnp.asarray(adv), jnp.asarray(MASK), 0.2, 0.28, dual_clip
    )
    terms = ppo_terms_numpy(log_ratio, adv, 0.2, 0.28, dual_clip)
    assert float(loss) == pytest.approx(terms[MASK].mean(), rel=1e-12)
    ratio = np.exp(log_ratio)
    clipped = -adv * np.clip(ratio, 0.8, 1.28) > -adv * ratio
    assert float(metrics["pg_clipfrac"]) == pytest.approx(clipped[MASK].mean(), rel=1e-6)
    assert metrics["pg_clipfrac"].dtype == jnp.float32
    assert float(metrics["ppo_kl"]) == pytest.approx(-log_ratio[MASK].mean(), rel=1e-12)
    if dual_clip is None:
        assert float(metrics["pg_clipfrac_lower"]) == 0.0
    else:
        plain = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.28))
        lower = (plain > -adv * dual_clip) & (adv < 0)
        assert lower[0, 0]
        assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(lower[MASK].mean(), rel=1e-6)


def test_clipped_surrogate_gradients() -> None:
    # Token 0: A > 0, ratio above 1 + eps, clipped: no gradient.
    # Token 1: A < 0, ratio far above the dual clip: capped, no gradient.
    # Token 2: inside the band: gradient -A * ratio / N.
    log_ratio = jnp.asarray([[0.5, 2.0, 0.05]])
    adv = jnp.asarray([[1.0, -1.0, 2.0]])
    mask = jnp.ones((1, 3), bool)
    grad = jax.grad(lambda lr: rl.clipped_surrogate(lr, adv, mask)[0])(log_ratio)
    np.testing.assert_allclose(np.asarray(grad), [[0.0, 0.0, -2.0 * np.exp(0.05) / 3]])


def test_clipped_surrogate_refuses_dual_clip_at_or_below_one() -> None:
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="dual_clip: expected a value above 1.0"):
        rl.clipped_surrogate(x, x, jnp.ones((1, 2), bool), dual_clip=1.0)


def test_clipped_surrogate_terms_are_zero_outside_the_mask() -> None:
    lr = jnp.asarray(RNG.normal(size=(B, T)))
    terms, _ = rl.clipped_surrogate_terms(lr, lr, jnp.asarray(MASK))
    assert not np.asarray(terms)[~MASK].any()


def test_gspo_composition_matches_verl_formula() -> None:
    lp = RNG.normal(-1.0, 0.5, (B, T))
    old = lp + RNG.normal(0, 0.2, (B, T))
    adv = np.repeat(RNG.normal(size=(B, 1)), T, axis=1)
    mask = jnp.asarray(MASK)

    def loss_fn(x):
        log_ratio = rl.sequence_log_ratio(x, jnp.asarray(old), mask)
        return rl.clipped_surrogate(log_ratio, jnp.asarray(adv), mask, 3e-4, 4e-4, None)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(lp))
    # verl compute_policy_loss_gspo (token-mean), written out in numpy.
    diff = np.where(MASK, lp - old, 0.0)
    seq = diff.sum(-1) / np.maximum(MASK.sum(-1), 1)
    s = np.exp(np.minimum(seq, 10.0))[:, None] * np.ones((1, T))
    terms = np.maximum(-adv * s, -adv * np.clip(s, 1 - 3e-4, 1 + 4e-4))
    assert float(loss) == pytest.approx(terms[MASK].mean(), rel=1e-12)
    # d/d lp_t of s_t is s_t itself; clipped tokens get nothing.
    inside = (-adv * s >= -adv * np.clip(s, 1 - 3e-4, 1 + 4e-4)) & MASK
    np.testing.assert_allclose(
        np.asarray(grad), np.where(inside, -adv * s / MASK.sum(), 0.0), rtol=1e-12, atol=1e-15
    )
    assert float(metrics["ppo_kl"]) == pytest.approx(-diff[MASK].mean(), rel=1e-12)


def test_sequence_log_ratio_clamps_at_ten_only_from_above() -> None:
    lp = jnp.asarray([[30.0, 30.0], [-30.0, -30.0]])
    out = rl.sequence_log_ratio(lp, jnp.zeros((2, 2)), jnp.ones((2, 2), bool))
    np.testing.assert_array_equal(np.asarray(out), [[10.0, 10.0], [-30.0, -30.0]])


def test_cispo_terms_and_gradient() -> None:
    lp = RNG.normal(-1.0, 0.5, (B, T))
    old = lp + RNG.normal(0, 0.4, (B, T))
    adv = RNG.normal(size=(B, T))
    mask = jnp.asarray(MASK)

    def loss_fn(x):
        terms, metrics = rl.cispo_terms(x, jnp.asarray(old), jnp.asarray(adv), mask, 0.2, 0.28)
        return rl.token_mean(terms, mask), metrics

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(lp))
    ratio = np.exp(lp - old)
    clipped = np.clip(ratio, 0.8, 1.28)
    assert float(loss) == pytest.approx((-clipped * adv * lp)[MASK].mean(), rel=1e-12)
    # The clipped ratio is detached: every kept token's gradient is -clip(r) * A / N.
    np.testing.assert_allclose(
        np.asarray(grad), np.where(MASK, -clipped * adv / MASK.sum(), 0.0), rtol=1e-12
    )
    assert float(metrics["pg_clipfrac"]) == pytest.approx((ratio != clipped)[MASK].mean(), rel=1e-6)


def test_clipped_value_loss_terms() -> None:
    pred = jnp.asarray([[1.0, 0.0, 0.3]])
    returns = jnp.asarray([[0.0, 1.0, 0.35]])
    old = jnp.asarray([[0.0, 0.5, 0.3]])
    terms = np.asarray(rl.clipped_value_loss_terms(pred, returns, old, clip=0.2))
    # Token 0: clipped to 0.2, errors 1.0 and 0.04 -> 0.5. Token 1: clipped to 0.3,
    # errors 1.0 and 0.49 -> 0.5. Token 2: inside the band, 0.5 * 0.05**2.
    np.testing.assert_allclose(terms, [[0.5, 0.5, 0.5 * 0.05**2]], rtol=1e-12)
    grads = jax.grad(lambda p, r, o: rl.clipped_value_loss_terms(p, r, o).sum(), argnums=(0, 1, 2))(
        pred, returns, old
    )
    np.testing.assert_allclose(np.asarray(grads[0]), [[1.0, -1.0, -0.05]], rtol=1e-12)
    assert not np.asarray(grads[1]).any() and not np.asarray(grads[2]).any()


def test_preference_logsigmoid_matches_formula() -> None:
    pc, pr, rc, rr = (RNG.normal(-1, 0.5, (2, 4)) for _ in range(4))
    mc = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    mr = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
    got = rl.preference_logsigmoid(*map(jnp.asarray, (pc, pr, rc, rr, mc, mr)), beta=0.1)
    margin = ((pc * mc).sum(1) - (rc * mc).sum(1)) - ((pr * mr).sum(1) - (rr * mr).sum(1))
    want = np.mean(np.log1p(np.exp(-0.1 * margin)))
    assert float(got) == pytest.approx(want, rel=1e-12)
    grads = jax.grad(
        lambda *a: rl.preference_logsigmoid(*a, jnp.asarray(mc), jnp.asarray(mr), 0.1),
        argnums=(0, 2),
    )(*map(jnp.asarray, (pc, pr, rc, rr)))
    assert not np.asarray(grads[1]).any()  # the reference carries no gradient
    assert not np.asarray(grads[0])[~mc].any()

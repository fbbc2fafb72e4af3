"""rl.policy_loss, the fused GRPO/PPO loss, against the composition of the per-term functions.

The composition ``clipped_surrogate(token_log_ratio(...)) + kl_coef * token_mean(k3_kl(...))``
is the definition; policy_loss must give its value (to float rounding: one sum instead of
two) and its gradient in ``log_probs`` under jit, on inputs that hit every branch: the +-20
log-ratio clamp, a ratio exactly on the clip bounds, the dual clip and its tie, k3's clamps,
zero advantages, and nan/inf in padding. verl parity is in tests/parity/test_rl_parity.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

LOW, HIGH, C, COEF = 0.2, 0.28, 3.0, 0.04


def composition(lp, old, adv, mask, ref, low=LOW, high=HIGH, c=C, coef=COEF):  # type: ignore[no-untyped-def]
    pg, _ = rl.clipped_surrogate(rl.token_log_ratio(lp, old), adv, mask, low, high, c)
    if ref is None:
        return pg
    # k3_kl takes no mask: select padding away first, as its docstring says to.
    keep = mask if mask.dtype == jnp.bool_ else mask != jnp.zeros((), mask.dtype)
    safe_lp, safe_ref = (jnp.where(keep, x, jnp.zeros((), x.dtype)) for x in (lp, ref))
    return pg + coef * rl.token_mean(rl.k3_kl(safe_lp, safe_ref), mask)


def fused(lp, old, adv, mask, ref, low=LOW, high=HIGH, c=C, coef=COEF):  # type: ignore[no-untyped-def]
    return rl.policy_loss(lp, old, adv, mask, ref, low, high, c, coef)[0]


def _inputs(dtype, seed: int = 3):  # type: ignore[no-untyped-def]
    """[4, 32] inputs with every branch: clamps, clip bounds, dual-clip ties, bad padding."""
    rng = np.random.default_rng(seed)
    b, t = 4, 32
    old = -np.abs(rng.normal(0, 2, (b, t)))
    lr = rng.normal(0, 0.4, (b, t))
    lr[0, :8] = [25.0, -25.0, 20.0, -20.0, np.log(0.8), np.log(1.28), 0.0, np.log(3.0)]
    lp = old + lr
    ref = lp + rng.normal(0, 0.5, (b, t))
    ref[1, :4] = lp[1, :4] + np.array([30.0, -30.0, 3.0, 20.0])  # k3 clamps, both sides
    adv = np.repeat(rng.normal(size=(b, 1)), t, axis=1)
    adv[0] = -1.0  # dual clip binds where the ratio passes 3 (and ties at log 3)
    adv[2, :5] = 0.0
    mask = rng.random((b, t)) < 0.8
    mask[0, :8] = True
    mask[3, -3:] = False
    lp[3, -3:], old[3, -2], ref[3, -1], adv[3, -3] = np.nan, np.inf, -np.inf, np.nan
    as_dtype = (jnp.asarray(x, dtype) for x in (lp, old, adv))
    return (*as_dtype, jnp.asarray(mask), jnp.asarray(ref, dtype))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("with_kl", [True, False])
def test_value_and_gradient_are_the_compositions(dtype, with_kl: bool) -> None:  # type: ignore[no-untyped-def]
    lp, old, adv, mask, ref = _inputs(dtype)
    ref = ref if with_kl else None
    coef = COEF if with_kl else 0.0

    def grads(f):  # type: ignore[no-untyped-def]
        return jax.jit(jax.value_and_grad(lambda x: f(x, old, adv, mask, ref, coef=coef)))(lp)

    (got, got_grad), (want, want_grad) = grads(fused), grads(composition)
    eps = float(jnp.finfo(dtype).eps)
    assert np.isfinite(float(want))
    np.testing.assert_allclose(float(got), float(want), rtol=4 * eps, atol=4 * eps)
    np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), rtol=4 * eps,
                               atol=4 * eps * float(jnp.max(jnp.abs(want_grad))))  # fmt: skip
    assert np.all(np.asarray(got_grad)[~np.asarray(mask)] == 0)
    assert np.all(np.isfinite(np.asarray(got_grad)))
    # The eager value (the primal, not the forward pass) agrees too.
    np.testing.assert_allclose(float(fused(lp, old, adv, mask, ref, coef=coef)), float(want),
                               rtol=4 * eps)  # fmt: skip


def test_gradient_follows_the_cotangent_and_only_log_probs_get_one() -> None:
    lp, old, adv, mask, ref = _inputs(jnp.float64)
    one = jax.grad(fused)(lp, old, adv, mask, ref)
    scaled = jax.grad(lambda x: -2.5 * fused(x, old, adv, mask, ref))(lp)
    np.testing.assert_allclose(np.asarray(scaled), -2.5 * np.asarray(one), rtol=1e-15)
    others = jax.grad(fused, argnums=(1, 2, 4))(lp, old, adv, mask, ref)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in others)


def test_metrics_are_clipped_surrogates_and_the_token_means() -> None:
    lp, old, adv, mask, ref = _inputs(jnp.float64)
    _, got = rl.policy_loss(lp, old, adv, mask, ref, LOW, HIGH, C, COEF)
    pg, want = rl.clipped_surrogate(rl.token_log_ratio(lp, old), adv, mask, LOW, HIGH, C)
    kl = composition(lp, old, adv, mask, ref, coef=1.0) - pg
    want = {**want, "pg_loss": pg, "kl_loss": kl}
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(float(got[name]), float(value), rtol=1e-14, err_msg=name)
    assert "kl_loss" not in rl.policy_loss(lp, old, adv, mask)[1]


def test_bf16_runs_in_bf16_like_the_composition() -> None:
    lp, old, adv, mask, ref = _inputs(jnp.bfloat16)
    (got, got_grad), (want, want_grad) = (
        jax.jit(jax.value_and_grad(lambda x, f=f: f(x, old, adv, mask, ref)))(lp)
        for f in (fused, composition)
    )
    assert got.dtype == got_grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(float(got), float(want), rtol=2**-7)
    scale = float(jnp.max(jnp.abs(want_grad.astype(jnp.float32))))
    np.testing.assert_allclose(np.asarray(got_grad, np.float32), np.asarray(want_grad, np.float32),
                               atol=2**-7 * scale)  # fmt: skip


def test_an_empty_mask_gives_nan_loss_and_zero_gradient() -> None:
    lp, old, adv, _, ref = _inputs(jnp.float64)
    mask = jnp.zeros(lp.shape, bool)
    loss, grad = jax.jit(jax.value_and_grad(fused))(lp, old, adv, mask, ref)
    assert np.isnan(float(loss))
    assert float(jnp.max(jnp.abs(grad))) == 0.0


def test_numeric_masks_and_no_dual_clip() -> None:
    lp, old, adv, mask, ref = _inputs(jnp.float64)
    for m in (mask.astype(jnp.int32), mask.astype(jnp.float64)):
        got = jax.grad(fused)(lp, old, adv, m, ref, c=None)
        want = jax.grad(composition)(lp, old, adv, m, ref, c=None)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-14, atol=1e-17)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ref_log_probs": None, "kl_coef": 0.1}, "kl_coef: expected 0 without ref_log_probs"),
        ({"dual_clip": 1.0}, "dual_clip: expected a value above 1.0"),
        ({"epsilon_low": jnp.asarray(0.2)}, "epsilon_low: expected a Python number"),
    ],
)
def test_refuses_bad_options_by_name(kwargs, message: str) -> None:  # type: ignore[no-untyped-def]
    lp, old, adv, mask, ref = _inputs(jnp.float64)
    with pytest.raises(ValueError, match=message):
        rl.policy_loss(lp, old, adv, mask, **{"ref_log_probs": ref, **kwargs})


def test_refuses_mismatched_inputs_by_name() -> None:
    lp, old, adv, mask, ref = _inputs(jnp.float64)
    with pytest.raises(ValueError, match="ref_log_probs"):
        rl.policy_loss(lp, old, adv, mask, ref[:, :-1], kl_coef=0.1)
    with pytest.raises((ValueError, TypeError), match="advantages"):
        rl.policy_loss(lp, old, adv.astype(jnp.float32), mask)

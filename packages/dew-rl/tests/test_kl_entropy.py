"""KL estimators and token entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(5)


def test_k1_k2_formulas_and_gradients() -> None:
    lp, ref = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    d = lp - ref
    np.testing.assert_allclose(np.asarray(rl.k1_kl(jnp.asarray(lp), jnp.asarray(ref))), d)
    np.testing.assert_allclose(
        np.asarray(rl.k2_kl(jnp.asarray(lp), jnp.asarray(ref))), 0.5 * d**2, rtol=1e-15
    )
    grad = jax.grad(lambda x: rl.k2_kl(x, jnp.asarray(ref)).sum())(jnp.asarray(lp))
    np.testing.assert_allclose(np.asarray(grad), d, rtol=1e-15)


def test_k3_is_non_negative_and_matches_formula() -> None:
    lp, ref = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4))
    got = np.asarray(rl.k3_kl(jnp.asarray(lp), jnp.asarray(ref)))
    d = ref - lp
    np.testing.assert_allclose(got, np.exp(d) - d - 1, rtol=1e-12)
    assert (got >= 0).all()
    assert float(rl.k3_kl(jnp.zeros(()), jnp.zeros(()))) == 0.0


def test_k3_clamps_log_ratio_and_estimate() -> None:
    # d = +25 is clamped to 20 and the estimate to 10; d = -25 gives e^-20 + 19, clamped to
    # 10; d = 2.5 gives e^2.5 - 3.5 = 8.68, unclamped.
    lp = jnp.asarray([-25.0, 25.0, -2.5])
    got = np.asarray(rl.k3_kl(lp, jnp.zeros(3)))
    np.testing.assert_allclose(got, [10.0, 10.0, np.exp(2.5) - 3.5], rtol=1e-12)
    grad = np.asarray(jax.grad(lambda x: rl.k3_kl(x, jnp.zeros(3)).sum())(lp))
    # Clamped entries pass no gradient; d/d lp of exp(d) - d - 1 is 1 - exp(d).
    np.testing.assert_allclose(grad, [0.0, 0.0, 1 - np.exp(2.5)], rtol=1e-12)


def test_abs_formula_and_gradient_at_a_tie() -> None:
    lp = jnp.asarray([-1.0, -2.0, -0.5])
    ref = jnp.asarray([-1.5, -1.0, -0.5])  # the last is a tie: |0| has gradient 0, as in torch
    np.testing.assert_array_equal(np.asarray(rl.abs_kl(lp, ref)), [0.5, 1.0, 0.0])
    grad = jax.grad(lambda x, y: rl.abs_kl(x, y).sum(), argnums=(0, 1))(lp, ref)
    np.testing.assert_array_equal(np.asarray(grad[0]), [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(grad[1]), [-1.0, 1.0, 0.0])


@pytest.mark.parametrize(
    ("names", "function"),
    [(("kl", "k1"), rl.k1_kl), (("abs",), rl.abs_kl), (("mse", "k2"), rl.k2_kl),
     (("low_var_kl", "k3"), rl.k3_kl)],
)  # fmt: skip
def test_kl_penalty_picks_the_estimator_by_verls_names(names, function) -> None:
    lp, ref = jnp.asarray(RNG.normal(size=(2, 3))), jnp.asarray(RNG.normal(size=(2, 3)))
    for name in names:
        assert name in rl.KL_ESTIMATORS
        np.testing.assert_array_equal(
            np.asarray(rl.kl_penalty(lp, ref, name)), np.asarray(function(lp, ref))
        )


@pytest.mark.parametrize("name", ["k3+", "full", "K3", ""])
def test_kl_penalty_refuses_other_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"^kl_estimator: expected one of kl, k1, abs, .*got"):
        rl.kl_penalty(jnp.zeros(2), jnp.zeros(2), name)


def test_kl_estimators_check_inputs() -> None:
    for fn in (rl.k1_kl, rl.abs_kl, rl.k2_kl, rl.k3_kl):
        with pytest.raises(ValueError, match="ref_log_probs: expected the shape"):
            fn(jnp.zeros((2, 3)), jnp.zeros((3, 2)))
        with pytest.raises(TypeError, match="ref_log_probs: expected the dtype"):
            fn(jnp.zeros(2, jnp.float32), jnp.zeros(2, jnp.float64))


def test_token_entropy_of_uniform_and_peaked() -> None:
    logits = jnp.asarray([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    got = np.asarray(rl.token_entropy(logits))
    np.testing.assert_allclose(got, [np.log(4.0), 0.0], atol=1e-12)


def test_token_entropy_matches_definition_and_gradient() -> None:
    logits = RNG.normal(0, 2, (2, 3, 6))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = np.asarray(rl.token_entropy(jnp.asarray(logits)))
    np.testing.assert_allclose(got, -(p * np.log(p)).sum(-1), rtol=1e-12)
    # dH/dz_i = -p_i (log p_i + H)
    grad = np.asarray(jax.grad(lambda z: rl.token_entropy(z).sum())(jnp.asarray(logits)))
    np.testing.assert_allclose(grad, -p * (np.log(p) + got[..., None]), rtol=1e-9, atol=1e-12)


def test_token_entropy_ignores_filtered_vocabulary() -> None:
    logits = jnp.asarray([[1.0, -jnp.inf, 2.0, -jnp.inf]])
    value, grad = jax.value_and_grad(lambda z: rl.token_entropy(z).sum())(logits)
    reference = rl.token_entropy(jnp.asarray([[1.0, 2.0]]))
    assert float(value) == pytest.approx(float(reference[0]), rel=1e-14)
    assert np.isfinite(np.asarray(grad)).all()
    assert np.asarray(grad)[0, 1] == 0.0


def test_token_entropy_keeps_dtype() -> None:
    logits = jnp.asarray(RNG.normal(size=(2, 5)), jnp.bfloat16)
    assert rl.token_entropy(logits).dtype == jnp.bfloat16

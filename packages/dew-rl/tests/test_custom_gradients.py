"""The hand-written backward passes of clipped_surrogate_terms and k3_kl against autodiff.

Both functions save only their inputs and recompute the exponentials in the backward pass
(faster under jax.jit on CPU). Their gradients must be reverse-mode autodiff's of the
plain formulas, written out here with jnp: the clamp's inclusive gradient, the even split
of max/min at a tie, zero at masked positions whatever they hold, nan at kept nan inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl
from dew.rl._masking import count_kept


def _clamp(x, low, high):  # type: ignore[no-untyped-def]
    x = jnp.where(x < low, jnp.asarray(low, x.dtype), x)
    return jnp.where(x > high, jnp.asarray(high, x.dtype), x)


def plain_surrogate_terms(log_ratio, adv, mask, eps_low, eps_high, dual_clip):  # type: ignore[no-untyped-def]
    lr = jnp.where(mask, log_ratio, 0.0)
    adv = jnp.where(mask, adv, 0.0)
    ratio = jnp.exp(lr)
    terms = jnp.maximum(-adv * ratio, -adv * _clamp(ratio, 1 - eps_low, 1 + eps_high))
    if dual_clip is not None:
        capped = -adv * jnp.asarray(dual_clip, lr.dtype)
        terms = jnp.where(adv < 0, jnp.minimum(capped, terms), terms)
    return jnp.where(mask, terms, 0.0)


def plain_k3(log_probs, ref_log_probs):  # type: ignore[no-untyped-def]
    d = _clamp(ref_log_probs - log_probs, -20.0, 20.0)
    return _clamp(jnp.exp(d) - d - 1, -10.0, 10.0)


def _inputs(dtype):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    cap = float(jnp.exp(jnp.asarray(1.2, dtype)))  # a ratio that lands exactly on the cap
    special = [0.0, 1.2, np.nan, np.inf, -np.inf, 25.0, -25.0, 0.1, -0.3, 2.0]
    lr = np.concatenate([special, rng.normal(0, 0.5, 22)])
    lr = np.tile(lr, 3)
    adv = np.repeat([-1.5, 0.7, 0.0], 32)
    adv[4] = np.nan
    mask = rng.random(96) < 0.8
    mask[:10] = True
    mask[40] = False
    lr[40] = np.nan  # masked nan: no trace anywhere
    cotangent = rng.normal(size=96)
    as_dtype = (jnp.asarray(x, dtype) for x in (lr, adv, cotangent))
    return (*as_dtype, jnp.asarray(mask), cap)


def _same(got, want) -> None:  # type: ignore[no-untyped-def]
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_surrogate_terms_gradients_are_autodiffs(dtype) -> None:  # type: ignore[no-untyped-def]
    lr, adv, ct, mask, cap = _inputs(dtype)
    for bounds in [(0.2, 0.28, 3.0), (0.0, 0.2, cap), (0.2, 0.2, None)]:

        def new(a, b, bounds=bounds):  # type: ignore[no-untyped-def]
            return jnp.sum(rl.clipped_surrogate_terms(a, b, mask, *bounds)[0] * ct)

        def old(a, b, bounds=bounds):  # type: ignore[no-untyped-def]
            return jnp.sum(plain_surrogate_terms(a, b, mask, *bounds) * ct)

        got = jax.grad(new, argnums=(0, 1))(lr, adv)
        want = jax.grad(old, argnums=(0, 1))(lr, adv)
        _same(got[0], want[0])
        _same(got[1], want[1])
        terms = rl.clipped_surrogate_terms(lr, adv, mask, *bounds)[0]
        _same(terms, plain_surrogate_terms(lr, adv, mask, *bounds))
        assert not np.asarray(got[0])[~np.asarray(mask)].any()
        # Under jit too (the log-ratio gradient is the one a policy loss uses).
        _same(jax.jit(jax.grad(new))(lr, adv), jax.jit(jax.grad(old))(lr, adv))


def test_surrogate_terms_with_traced_bounds_still_differentiate() -> None:
    lr, adv, ct, mask, _ = _inputs(jnp.float32)

    def loss(eps):  # type: ignore[no-untyped-def]
        return jnp.sum(rl.clipped_surrogate_terms(lr, adv, mask, eps, eps, 3.0)[0] * ct)

    def plain(eps):  # type: ignore[no-untyped-def]
        return jnp.sum(plain_surrogate_terms(lr, adv, mask, eps, eps, 3.0) * ct)

    _same(jax.grad(loss)(jnp.float32(0.2)), jax.grad(plain)(jnp.float32(0.2)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_k3_gradients_are_autodiffs(dtype) -> None:  # type: ignore[no-untyped-def]
    special = [0.0, 20.0, -20.0, 21.0, -21.0, np.nan, np.inf, -np.inf, 3.0, -3.0, -2.4]
    lp = jnp.asarray(np.concatenate([special, np.linspace(-4, 4, 21)]), dtype)
    ref = jnp.zeros_like(lp).at[11:].set(jnp.asarray(np.linspace(-1, 1, 21), dtype))
    ct = jnp.asarray(np.random.default_rng(1).normal(size=32), dtype)
    got = jax.grad(lambda a, b: jnp.sum(rl.k3_kl(a, b) * ct), argnums=(0, 1))(lp, ref)
    want = jax.grad(lambda a, b: jnp.sum(plain_k3(a, b) * ct), argnums=(0, 1))(lp, ref)
    _same(got[0], want[0])
    _same(got[1], want[1])
    _same(rl.k3_kl(lp, ref), plain_k3(lp, ref))
    batched = jax.vmap(jax.grad(lambda a: rl.k3_kl(a, ref).sum()))(jnp.stack([lp, lp]))
    _same(batched[1], jax.grad(lambda a: plain_k3(a, ref).sum())(lp))


@pytest.mark.parametrize("shape", [(3, 16), (5, 7), (1,), (2, 3, 4)])
def test_count_kept_is_exact(shape) -> None:  # type: ignore[no-untyped-def]
    keep = np.random.default_rng(2).random(shape) < 0.6
    assert float(count_kept(jnp.asarray(keep))) == keep.sum()
    assert float(jax.jit(count_kept)(jnp.asarray(keep))) == keep.sum()

"""Sampling: raw and behavior likelihoods, filters, supports and validation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.sampling import Sampling, draw, is_eos

PROBS = np.array([0.05, 0.5, 0.15, 0.3], np.float32)  # sorted: ids 1, 3, 2, 0
LOGITS = jnp.asarray(np.log(PROBS) + 2.0)[None, :]


def _draws(sampling: Sampling, n: int = 4000):
    logits = jnp.broadcast_to(LOGITS, (n, 4))
    return jax.jit(draw, static_argnums=2)(logits, jax.random.key(0), sampling)


def test_greedy_has_zero_behavior_and_raw_log_softmax():
    out = draw(LOGITS, jax.random.key(0), Sampling(temperature=0.0, return_support=True))
    assert int(out.ids[0]) == 1
    assert float(out.behavior_log_probs[0]) == 0.0
    np.testing.assert_allclose(out.raw_log_probs[0], np.log(0.5), rtol=1e-6)
    assert out.support.tolist() == [[1]]


def test_temperature_frequencies_and_likelihoods():
    sampling = Sampling(temperature=2.0)
    out = _draws(sampling)
    tempered = np.asarray(jax.nn.log_softmax(LOGITS[0] / 2.0))
    freq = np.bincount(np.asarray(out.ids), minlength=4) / out.ids.shape[0]
    np.testing.assert_allclose(freq, np.exp(tempered), atol=0.03)
    np.testing.assert_allclose(out.behavior_log_probs, tempered[np.asarray(out.ids)], rtol=1e-5)
    np.testing.assert_allclose(out.raw_log_probs, np.log(PROBS)[np.asarray(out.ids)], rtol=1e-5)


def test_top_k_keeps_exactly_k_and_reports_support():
    out = _draws(Sampling(temperature=1.0, top_k=2, return_support=True))
    ids = np.asarray(out.ids)
    assert set(ids.tolist()) == {1, 3}
    assert np.asarray(out.support)[0].tolist() == [1, 3]
    renorm = np.log(PROBS / (0.5 + 0.3))
    np.testing.assert_allclose(out.behavior_log_probs, renorm[ids], rtol=1e-5)
    freq = np.mean(ids == 1)
    assert abs(freq - 0.5 / 0.8) < 0.03


@pytest.mark.parametrize(("top_p", "kept"), [(0.5, {1}), (0.8, {1, 3}), (0.81, {1, 3, 2})])
def test_top_p_prefix(top_p, kept):
    out = _draws(Sampling(top_p=top_p, return_support=True), n=2000)
    assert set(np.asarray(out.ids).tolist()) == kept
    support = np.asarray(out.support)[0]
    assert set(support[support >= 0].tolist()) == kept and support.shape == (4,)
    mass = PROBS[sorted(kept)].sum()
    ids = np.asarray(out.ids)
    np.testing.assert_allclose(out.behavior_log_probs, np.log(PROBS[ids] / mass), rtol=1e-5)


def test_min_p_and_top_k_combine():
    out = _draws(Sampling(min_p=0.2), n=2000)
    assert set(np.asarray(out.ids).tolist()) == {1, 3, 2}  # 0.05 < 0.2 * 0.5
    out = _draws(Sampling(top_k=3, min_p=0.5, return_support=True), n=2000)
    assert set(np.asarray(out.ids).tolist()) == {1, 3}  # 0.15 / 0.95 < 0.5 * 0.5 / 0.95
    assert np.asarray(out.support)[0].tolist() == [1, 3, -1]


def test_softcap_before_temperature():
    logits = jnp.array([[0.0, 30.0, 10.0]])
    sampling = Sampling(temperature=0.5, softcap=5.0)
    out = draw(logits, jax.random.key(1), sampling)
    capped = 5.0 * np.tanh(np.array([0.0, 30.0, 10.0]) / 5.0) / 0.5
    expected = np.asarray(jax.nn.log_softmax(jnp.asarray(capped)))[int(out.ids[0])]
    np.testing.assert_allclose(out.behavior_log_probs[0], expected, rtol=1e-5)
    np.testing.assert_allclose(
        out.raw_log_probs[0], np.asarray(jax.nn.log_softmax(logits[0]))[int(out.ids[0])], rtol=1e-5
    )


def test_eos_ids_and_hashing():
    assert Sampling(eos_id=3).eos_ids == (3,)
    s = Sampling(eos_id=[4, 5])
    assert s.eos_ids == (4, 5) and hash(s) == hash(Sampling(eos_id=(4, 5)))
    assert is_eos(jnp.array([3, 4, 5, 6]), s).tolist() == [False, True, True, False]
    assert Sampling().eos_ids == ()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"eos_id": ()}, "eos_id"),
        ({"eos_id": (1, -1)}, "eos_id"),
        ({"softcap": 0.0}, "softcap"),
        ({"return_support": True}, "return_support"),
    ],
)
def test_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Sampling(**kwargs)


def test_first_argmax_matches_jnp_argmax():
    from dew.sampling import first_argmax

    x = jax.random.normal(jax.random.key(3), (16, 50))
    x = x.at[0, 7].set(9.0).at[0, 30].set(9.0)  # tie: first index wins
    x = x.at[1, 12].set(jnp.nan).at[1, 40].set(jnp.nan)  # NaN: first NaN, like argmax
    np.testing.assert_array_equal(first_argmax(x), jnp.argmax(x, axis=-1))
    assert int(first_argmax(x)[0]) == 7 and int(first_argmax(x)[1]) == 12

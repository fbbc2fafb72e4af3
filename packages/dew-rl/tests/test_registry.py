"""The registries: built-in entries, registration, lookup and their errors."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

RNG = np.random.default_rng(11)
_NUMBERS = itertools.count()
KINDS = {
    "policy_loss": (rl.register_policy_loss, rl.get_policy_loss),
    "estimator": (rl.register_advantage_estimator, rl.get_advantage_estimator),
    "aggregation": (rl.register_aggregation, rl.get_aggregation),
}


def _fresh(prefix: str) -> str:
    """A name no other test registers (the registries live for the whole process)."""
    return f"test-{prefix}-{next(_NUMBERS)}"


def test_builtin_names_come_first_in_registration_order() -> None:
    assert rl.registered("policy_loss")[:3] == ("ppo", "gspo", "cispo")
    assert rl.registered("estimator")[:3] == ("group", "mean", "rloo")
    assert rl.registered("aggregation")[:2] == ("token-mean", "session-mean")


def test_registered_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match=r"kind: expected one of .*policy_loss.*got 'loss'"):
        rl.registered("loss")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_register_then_look_up_returns_the_same_function(kind: str) -> None:
    register, lookup = KINDS[kind]
    name = _fresh(kind)

    def entry(*args, **kwargs):  # never called here
        raise AssertionError

    assert register(name)(entry) is entry
    assert lookup(name) is entry
    assert rl.registered(kind)[-1] == name


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_registering_a_name_twice_raises_and_keeps_the_first(kind: str) -> None:
    register, lookup = KINDS[kind]
    name = _fresh(kind)

    def first(*args, **kwargs):
        raise AssertionError

    register(name)(first)
    with pytest.raises(ValueError, match=f"{kind}: '{name}' is already registered"):
        register(name)(lambda *a, **k: None)
    assert lookup(name) is first
    builtin = rl.registered(kind)[0]
    with pytest.raises(ValueError, match=f"'{builtin}' is already registered"):
        register(builtin)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unknown_name_error_names_the_field_the_choices_and_what_came(kind: str) -> None:
    _, lookup = KINDS[kind]
    with pytest.raises(ValueError) as error:
        lookup("no-such-entry")
    message = str(error.value)
    assert message.startswith(f"{kind}: expected one of ")
    for name in rl.registered(kind):
        assert name in message
    assert message.endswith("got 'no-such-entry'")


def test_register_refuses_a_non_string_name_and_a_non_callable() -> None:
    with pytest.raises(TypeError, match="name: expected a non-empty string"):
        rl.register_policy_loss("")
    with pytest.raises(TypeError, match=re.escape("expected a callable, got int")):
        rl.register_aggregation(_fresh("aggregation"))(3)  # type: ignore[type-var]


def _policy_inputs() -> tuple[jax.Array, ...]:
    old = jnp.asarray(-np.abs(RNG.normal(size=(3, 8))))
    log_probs = old + 0.3 * jnp.asarray(RNG.normal(size=(3, 8)))
    advantages = jnp.asarray(np.repeat(RNG.normal(size=(3, 1)), 8, axis=1))
    mask = jnp.asarray(np.arange(8)[None, :] < np.array([[8], [5], [2]]))
    return log_probs, old, advantages, mask


def test_builtin_policy_losses_are_the_dew_rl_compositions() -> None:
    log_probs, old, advantages, mask = _policy_inputs()
    segments = jnp.asarray(np.where(np.asarray(mask), 1, 0), jnp.int32)
    bounds = {"epsilon_low": 0.2, "epsilon_high": 0.28, "dual_clip": 3.0}
    ppo, pg = rl.get_policy_loss("ppo")(log_probs, old, advantages, mask, segments=None, **bounds)
    want, want_pg = rl.clipped_surrogate_terms(
        rl.token_log_ratio(log_probs, old), advantages, mask, 0.2, 0.28, 3.0
    )
    np.testing.assert_array_equal(ppo, want)
    assert pg == want_pg
    gspo, pg = rl.get_policy_loss("gspo")(
        log_probs, old, advantages, mask, segments=segments, **bounds
    )
    log_ratio = rl.sequence_log_ratio(log_probs, old, mask, segments)
    want, _ = rl.clipped_surrogate_terms(log_ratio, advantages, mask, 0.2, 0.28, None)
    np.testing.assert_array_equal(gspo, want)
    assert float(pg["ppo_kl"]) == float(rl.masked_mean(old - log_probs, mask))
    cispo, _ = rl.get_policy_loss("cispo")(
        log_probs, old, advantages, mask, segments=None, **bounds
    )
    np.testing.assert_array_equal(
        cispo, rl.cispo_terms(log_probs, old, advantages, mask, 0.2, 0.28)[0]
    )


@pytest.mark.parametrize("estimator", ["group", "mean", "rloo"])
def test_builtin_estimators_are_ragged_group_advantage(estimator: str) -> None:
    rewards = jnp.asarray(RNG.normal(size=9))
    group_ids = jnp.asarray([4, 1, 4, 4, 2, 1, 9, 2, 2])
    mask = jnp.asarray([1, 1, 1, 0, 1, 1, 1, 1, 1])
    got = rl.get_advantage_estimator(estimator)(rewards, group_ids, mask, 1e-6)
    want = rl.ragged_group_advantage(rewards, group_ids, mask, estimator, 1e-6)
    np.testing.assert_array_equal(got, want)


def test_builtin_aggregations_give_a_total_and_its_weight() -> None:
    x = jnp.asarray([[1.0, 2.0, 3.0, jnp.nan], [4.0, 5.0, 6.0, 7.0]])
    mask = jnp.asarray([[1, 1, 1, 0], [1, 0, 1, 1]])
    total, weight = rl.get_aggregation("token-mean")(x, mask, None)
    assert (float(total), float(weight)) == (23.0, 6.0)
    sessions = jnp.asarray([[0, 0, 1, 1], [2, 2, 1, 1]])
    total, weight = rl.get_aggregation("session-mean")(x, mask, sessions)
    # session 0: (1 + 2) / 2, session 1: (3 + 6 + 7) / 3, session 2: 4 / 1 (5 is dropped)
    np.testing.assert_allclose(float(total), 1.5 + 16.0 / 3 + 4.0, rtol=1e-6)
    assert float(weight) == 3.0
    with pytest.raises(ValueError, match="group_ids: expected"):
        rl.get_aggregation("session-mean")(x, mask, None)
    # verl's names: seq-mean-token-mean is session-mean; seq-mean-token-sum sums each session
    assert rl.get_aggregation("seq-mean-token-mean") is rl.get_aggregation("session-mean")
    total, weight = rl.get_aggregation("seq-mean-token-sum")(x, mask, sessions)
    assert (float(total), float(weight)) == (23.0, 3.0)  # (1 + 2) + (3 + 6 + 7) + 4
    with pytest.raises(ValueError, match="group_ids: expected"):
        rl.get_aggregation("seq-mean-token-sum")(x, mask, None)


def test_a_registered_policy_loss_runs_under_jit_and_grad() -> None:
    name = _fresh("policy_loss")

    @rl.register_policy_loss(name)
    def reinforce(log_probs, old_log_probs, advantages, mask, **unused):
        return jnp.where(mask, -advantages * log_probs, 0.0), {}

    log_probs, old, advantages, mask = _policy_inputs()

    def loss(lp):
        terms, _ = rl.get_policy_loss(name)(
            lp, old, advantages, mask, segments=None, epsilon_low=0.2, epsilon_high=0.2,
            dual_clip=None,
        )  # fmt: skip
        return rl.token_mean(terms, mask)

    grad = jax.jit(jax.grad(loss))(log_probs)
    np.testing.assert_allclose(
        grad, np.where(mask, -advantages / float(mask.sum()), 0.0), rtol=1e-12
    )

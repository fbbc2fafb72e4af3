"""The public surface: names, jit-ability, dtypes, docstrings naming their reference."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

SPEC_NAMES = {
    "behavior_importance_weights",
    "clipped_surrogate",
    "clipped_value_loss_terms",
    "gae",
    "group_advantage",
    "k3_kl",
    "masked_mean",
    "masked_whiten",
    "preference_logsigmoid",
    "rloo_advantage",
    "sequence_log_ratio",
    "token_log_ratio",
    "token_mean",
}
EXTRA_NAMES = {
    "segment_mean",
    "sequence_mean",
    "sequence_sum_mean",
    "sequence_sum_norm",
    "cispo_terms",
    "clipped_surrogate_terms",
    "k1_kl",
    "k2_kl",
    "abs_kl",
    "kl_penalty",
    "token_entropy",
    "icepop_weights",
    "token_rejection_mask",
    "sequence_rejection_mask",
    "ragged_group_advantage",
    "policy_loss",
    "group_sums",
    "kl_reward",
    "overlong_penalty",
}
#: Host arithmetic on Python floats (the adaptive KL controller's update): no arrays, no jit.
HOST_NAMES = {"adaptive_kl_coefficient"}
#: The registry's functions: they take and return names and functions, not arrays.
REGISTRY_NAMES = {
    "registered",
    "register_policy_loss",
    "get_policy_loss",
    "register_advantage_estimator",
    "get_advantage_estimator",
    "register_aggregation",
    "get_aggregation",
}
RNG = np.random.default_rng(1)


def test_all_lists_every_function_and_group_eps() -> None:
    assert set(rl.__all__) == SPEC_NAMES | EXTRA_NAMES | REGISTRY_NAMES | HOST_NAMES | {
        "GROUP_EPS",
        "KL_ESTIMATORS",
    }
    for name in rl.__all__:
        assert getattr(rl, name) is not None


@pytest.mark.parametrize("name", sorted(SPEC_NAMES | EXTRA_NAMES | REGISTRY_NAMES))
def test_docstring_names_its_reference_and_revision(name: str) -> None:
    doc = inspect.getdoc(getattr(rl, name)) or ""
    assert "verl 0.9.1" in doc or "TRL 1.16.0" in doc, name
    assert "[B" in doc or "[..." in doc, name


def test_spec_signatures_and_defaults() -> None:
    sig = inspect.signature(rl.clipped_surrogate)
    assert list(sig.parameters) == [
        "log_ratio",
        "advantages",
        "mask",
        "epsilon_low",
        "epsilon_high",
        "dual_clip",
    ]
    assert sig.parameters["dual_clip"].default == 3.0
    assert inspect.signature(rl.group_advantage).parameters["eps"].default == rl.GROUP_EPS
    assert inspect.signature(rl.clipped_value_loss_terms).parameters["clip"].default == 0.2
    assert inspect.signature(rl.sequence_log_ratio).parameters["segments"].default is None
    assert list(inspect.signature(rl.gae).parameters) == [
        "token_rewards",
        "values",
        "mask",
        "gamma",
        "lam",
    ]


def _calls(dtype):
    """One call per public function, on float arrays of ``dtype``."""
    a, b, c = (jnp.asarray(RNG.normal(size=(2, 4)), dtype) for _ in range(3))
    m = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    seg = jnp.asarray([[1, 1, 2, 0], [1, 1, 1, 0]], jnp.int32)
    r = jnp.asarray(RNG.normal(size=4), dtype)
    return {
        "behavior_importance_weights": lambda: rl.behavior_importance_weights(a, b, m, 2.0),
        "clipped_surrogate": lambda: rl.clipped_surrogate(a, b, m),
        "clipped_surrogate_terms": lambda: rl.clipped_surrogate_terms(a, b, m, 0.2, 0.3, None),
        "clipped_value_loss_terms": lambda: rl.clipped_value_loss_terms(a, b, c),
        "cispo_terms": lambda: rl.cispo_terms(a, b, c, m),
        "gae": lambda: rl.gae(a, b, m, 0.99, 0.95),
        "group_advantage": lambda: rl.group_advantage(r, 2),
        "icepop_weights": lambda: rl.icepop_weights(a, b, m, 0.5, 2.0),
        "k1_kl": lambda: rl.k1_kl(a, b),
        "k2_kl": lambda: rl.k2_kl(a, b),
        "abs_kl": lambda: rl.abs_kl(a, b),
        "kl_penalty": lambda: rl.kl_penalty(a, b, "mse"),
        "kl_reward": lambda: rl.kl_reward(a, rl.k1_kl(b, c), m, 0.1),
        "overlong_penalty": lambda: rl.overlong_penalty(
            jnp.asarray([1, 5, 7, 8], dtype), 8, 4, 1.0
        ),
        "k3_kl": lambda: rl.k3_kl(a, b),
        "masked_mean": lambda: rl.masked_mean(a, m),
        "masked_whiten": lambda: rl.masked_whiten(a, m),
        "policy_loss": lambda: rl.policy_loss(a, b, c, m, a - b, 0.2, 0.28, 3.0, 0.04),
        "preference_logsigmoid": lambda: rl.preference_logsigmoid(a, b, c, a, m, m, 0.1),
        "rloo_advantage": lambda: rl.rloo_advantage(r, 2),
        "ragged_group_advantage": lambda: rl.ragged_group_advantage(
            r, jnp.asarray([3, 1, 3, 3]), jnp.asarray([1, 1, 1, 0])
        ),
        "segment_mean": lambda: rl.segment_mean(a, m, seg),
        "group_sums": lambda: rl.group_sums(a, m, seg),
        "sequence_log_ratio": lambda: rl.sequence_log_ratio(a, b, m, seg),
        "sequence_mean": lambda: rl.sequence_mean(a, m, seg),
        "sequence_rejection_mask": lambda: rl.sequence_rejection_mask(a, b, m, 0.5, 2.0, True),
        "sequence_sum_mean": lambda: rl.sequence_sum_mean(a, m),
        "sequence_sum_norm": lambda: rl.sequence_sum_norm(a, m, 16.0, seg),
        "token_entropy": lambda: rl.token_entropy(a),
        "token_log_ratio": lambda: rl.token_log_ratio(a, b),
        "token_mean": lambda: rl.token_mean(a, m),
        "token_rejection_mask": lambda: rl.token_rejection_mask(a, b, m, 0.5, 2.0),
    }


def test_every_function_is_covered_here() -> None:
    assert set(_calls(jnp.float32)) == SPEC_NAMES | EXTRA_NAMES


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_every_function_jits_and_matches_eager(dtype) -> None:
    # XLA may reorder a jitted reduction; whitening's centring then shows a few float32 ulps.
    atol = 1e-6 if dtype == jnp.float32 else 1e-13
    for name, call in _calls(dtype).items():
        eager = call()
        jitted = jax.jit(call)()
        for e, j in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(
                np.asarray(e, np.float64),
                np.asarray(j, np.float64),
                rtol=1e-6,
                atol=atol,
                err_msg=name,
            )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_floating_results_keep_the_input_dtype(dtype) -> None:
    masks = {"token_rejection_mask", "sequence_rejection_mask"}
    for name, call in _calls(dtype).items():
        out = call()
        main = out[0] if isinstance(out, tuple) else out
        assert main.dtype == (jnp.bool_ if name in masks else dtype), name

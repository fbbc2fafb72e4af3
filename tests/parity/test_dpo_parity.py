"""DPOObjective's loss math against TRL 1.16.0's DPO sigmoid loss and autograd gradients,
and against its RPO form (``loss_type=["sigmoid", "sft"]``: the chosen side's token-mean NLL
added with a weight, Dew's ``nll_weight``).

The fixtures (``tests/fixtures/dpo``) were written by ``tools/parity_dpo.py``, which ran
``DPOTrainer._compute_loss`` on fixed per-token log-probabilities. Here the same inputs go
through ``dew.objectives.rl.dpo.dpo_terms`` (``dew.rl.preference_logsigmoid`` plus Dew's
masked sums); loss, gradients w.r.t. the per-token policy log-probs and the logged reward
metrics must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl.dpo import dpo_terms

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dpo"
SIDECAR = json.loads((FIXTURES / "trl_dpo.json").read_text())
CASES = [case["file"] for case in SIDECAR["cases"]]
TRL_METRICS = {
    "rewards/chosen": "metric_rewards_chosen",
    "rewards/rejected": "metric_rewards_rejected",
    "rewards/accuracy": "metric_rewards_accuracies",
    "rewards/margin": "metric_rewards_margins",
}


def test_sidecar_names_the_reference() -> None:
    assert SIDECAR["package"] == "trl"
    assert SIDECAR["version"] == "1.16.0"
    assert SIDECAR["options"]["loss_type"] == "sigmoid"
    assert len(SIDECAR["wheel_sha256"]) == 64
    assert len(CASES) >= 5
    rpo = [c for c in SIDECAR["cases"] if c["loss_type"] == ["sigmoid", "sft"]]
    assert len(rpo) >= 2 and all(c["loss_weights"][1] > 0 for c in rpo)


def _dew(fixture: np.lib.npyio.NpzFile) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    beta = float(fixture["beta"])
    nll_weight = float(fixture["nll_weight"]) if "nll_weight" in fixture else 0.0
    mask = jnp.asarray(fixture["completion_mask"][:, :, 1:] > 0)
    reference = jnp.asarray(fixture["reference_log_probs"])

    def loss(policy: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        return dpo_terms(policy, reference, mask, beta, nll_weight)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(
        jnp.asarray(fixture["policy_log_probs"])
    )
    return value, grad, metrics


@pytest.mark.parametrize("name", CASES)
def test_loss_and_gradients_match_trl(name: str) -> None:
    fixture = np.load(FIXTURES / name)
    value, grad, metrics = _dew(fixture)
    expected_grad = fixture["grad_policy_log_probs"]
    loss_diff = abs(float(value) - float(fixture["loss"]))
    grad_diff = float(np.max(np.abs(np.asarray(grad) - expected_grad)))
    print(f"{name}: |loss - trl| = {loss_diff:.3g}, max |grad - trl| = {grad_diff:.3g}")
    np.testing.assert_allclose(float(value), float(fixture["loss"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-6, atol=1e-7)
    # Positions outside the completion mask get exactly zero gradient, as in TRL.
    outside = fixture["completion_mask"][:, :, 1:] == 0
    assert np.all(np.asarray(grad)[outside] == 0.0)
    for ours, theirs in TRL_METRICS.items():
        np.testing.assert_allclose(
            float(metrics[ours]), float(fixture[theirs]), rtol=1e-6, atol=1e-6, err_msg=ours
        )


def test_masked_garbage_does_not_leak() -> None:
    fixture = np.load(FIXTURES / CASES[0])
    outside = fixture["completion_mask"][:, :, 1:] == 0
    policy = np.where(outside, np.nan, fixture["policy_log_probs"]).astype(np.float32)
    reference = np.where(outside, np.inf, fixture["reference_log_probs"]).astype(np.float32)
    mask = jnp.asarray(~outside)

    def loss(p: jax.Array) -> jax.Array:
        return dpo_terms(p, jnp.asarray(reference), mask, float(fixture["beta"]))[0]

    value, grad = jax.value_and_grad(loss)(jnp.asarray(policy))
    np.testing.assert_allclose(float(value), float(fixture["loss"]), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(grad), fixture["grad_policy_log_probs"], rtol=1e-6, atol=1e-7
    )

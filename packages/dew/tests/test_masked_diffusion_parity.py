"""MDLM's masked diffusion loss (recorded by tools/parity_mdlm.py) against dew.objectives.diffusion.

The fixture holds, per schedule, MDLM's own code (kuleshov-group/mdlm, the commit and blob
hashes in the JSON sidecar) run on fixed logits: the times it drew, the ids it masked, its
sigma, rate and mask probability, its SUBS log-probabilities, the per-token ``nlls`` (times the
attention mask), the token loss and the loss's gradient with respect to the logits. Here Dew's
pure functions see the same logits, tokens, masked positions and times.

MDLM draws masks over padding too and drops them with the attention mask; Dew never masks
padding. The comparison feeds MDLM's masks as they are and multiplies by the attention mask,
as MDLM's ``_loss`` does, so both sides compute the same sum.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.diffusion import diffusion_nll, schedule_named, subs_log_probs

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "mdlm"
SIDECAR = json.loads((FIXTURES / "mdlm_loss.json").read_text())
with np.load(FIXTURES / "mdlm_loss.npz") as _z:
    REF = {k: _z[k] for k in _z.files}
CASES = sorted(SIDECAR["cases"])
MASK = SIDECAR["mask_index"]


def _case(name: str) -> dict[str, np.ndarray]:
    return {k.split("/", 1)[1]: v for k, v in REF.items() if k.startswith(f"{name}/")}


def _token_loss(logits, ref, schedule):  # noqa: ANN001, ANN202
    masked = jnp.asarray(ref["xt"] == MASK)
    nll = diffusion_nll(
        logits, jnp.asarray(ref["x0"]), masked, jnp.asarray(ref["t"]), MASK, schedule
    )
    nlls = nll * jnp.asarray(ref["attention"])
    return jnp.sum(nlls) / jnp.sum(jnp.asarray(ref["attention"])), nlls


def _diff(a, b) -> float:  # noqa: ANN001
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def test_the_fixture_names_its_reference() -> None:
    assert SIDECAR["revision"] == "c112c526d193436838c98d81455ee51f90309470"
    assert SIDECAR["package"] == "mdlm" and SIDECAR["dtype"] == "float32"
    for name in CASES:
        ref = _case(name)
        assert (ref["xt"] == MASK).any() and (ref["xt"][ref["attention"] > 0] == MASK).any()


@pytest.mark.parametrize("name", CASES)
def test_schedule_matches_mdlm(name: str) -> None:
    ref, schedule = _case(name), schedule_named(name)
    t = jnp.asarray(ref["t"])
    np.testing.assert_allclose(schedule.sigma(t), ref["sigma"], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(schedule.rate(t), ref["dsigma"], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(schedule.move_chance(t), ref["move_chance"], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", CASES)
def test_subs_matches_mdlm(name: str) -> None:
    ref = _case(name)
    got = np.asarray(subs_log_probs(jnp.asarray(ref["logits"]), jnp.asarray(ref["xt"]), MASK))
    want = ref["subs"]
    near = want > -1e5  # the ordinary log-probabilities; -1e6 entries agree to their ulp
    np.testing.assert_allclose(got[near], want[near], rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(got[~near], want[~near], rtol=1e-7)


@pytest.mark.parametrize("name", CASES)
def test_loss_and_logit_gradient_match_mdlm(name: str) -> None:
    ref, schedule = _case(name), schedule_named(name)
    logits = jnp.asarray(ref["logits"])
    (loss, nlls), grad = jax.value_and_grad(_token_loss, has_aux=True)(logits, ref, schedule)
    diffs = {
        "loss": _diff(loss, ref["loss"]),
        "nlls": _diff(nlls, ref["nlls"]),
        "grad": _diff(grad, ref["grad_logits"]),
    }
    print(f"mdlm {name}: largest absolute differences {diffs}")
    np.testing.assert_allclose(loss, ref["loss"], rtol=2e-6)
    np.testing.assert_allclose(nlls, ref["nlls"], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(grad, ref["grad_logits"], rtol=2e-6, atol=1e-8)

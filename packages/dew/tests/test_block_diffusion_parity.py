"""BD3-LM's block diffusion loss (recorded by tools/parity_bd3lm.py) against Dew's.

The fixture holds, per case (a block size and a clip of the mask rate), bd3lms' own code
(kuleshov-group/bd3lms, the commit and blob hashes in the JSON sidecar) run on fixed logits:
the uniform draws behind its block times and masks, the per-token times, the ids it masked,
its SUBS output, the per-token ``nlls`` (times the attention mask), the token loss, the loss's
gradient with respect to the logits and its ``block_diff_mask`` over the ``[2L, 2L]`` grid.

BD3-LM draws masks over padding too and drops them with the attention mask; Dew never masks
padding. The comparison multiplies by the attention mask, as BD3-LM's ``_loss`` does.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.layers import two_copy_visible
from dew.objectives.block_diffusion import (
    block_diffusion_nll,
    block_times_from_uniform,
    token_times,
)
from dew.testing import tiny_decoder

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "bd3lm"
SIDECAR = json.loads((FIXTURES / "bd3lm_loss.json").read_text())
with np.load(FIXTURES / "bd3lm_loss.npz") as _z:
    REF = {k: _z[k] for k in _z.files}
CASES = sorted(SIDECAR["cases"])
MASK = SIDECAR["mask_index"]
B, L, V = SIDECAR["shape"]


def _case(name: str) -> tuple[dict[str, np.ndarray], int, float, float]:
    ref = {k.split("/", 1)[1]: v for k, v in REF.items() if k.startswith(f"{name}/")}
    case = SIDECAR["cases"][name]
    return ref, case["block_size"], case["eps_min"], case["eps_max"]


def _token_loss(logits, ref, eps_min):  # noqa: ANN001, ANN202
    attention = jnp.asarray(ref["attention"])
    masked = jnp.asarray(ref["xt"] == MASK) & (attention > 0)
    nll = block_diffusion_nll(
        logits, jnp.asarray(ref["x0"]), masked, jnp.asarray(ref["t"]), MASK, eps_min
    )
    nlls = nll * attention
    return jnp.sum(nlls) / jnp.sum(attention), nlls


def _diff(a, b) -> float:  # noqa: ANN001
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def test_the_fixture_names_its_reference() -> None:
    assert SIDECAR["revision"] == "1c3e8f43d88dfbcee5ff2aa6932a9e74b31ae1d7"
    assert SIDECAR["package"] == "bd3lms" and SIDECAR["dtype"] == "float32"
    assert {SIDECAR["cases"][n]["block_size"] for n in CASES} == {1, 2, 4, 16}
    for name in CASES:
        ref, _, eps_min, _ = _case(name)
        real = ref["attention"] > 0
        assert (ref["xt"][real] == MASK).any()
        assert eps_min >= 1.0 or not (ref["xt"][real] == MASK).all()


@pytest.mark.parametrize("name", CASES)
def test_block_times_and_masks_match_bd3lm(name: str) -> None:
    ref, size, eps_min, eps_max = _case(name)
    times = block_times_from_uniform(jnp.asarray(ref["u_time"]), eps_min, eps_max)
    positions = jnp.broadcast_to(jnp.arange(L), (B, L))
    t = np.asarray(token_times(times, positions, size))
    assert _diff(t, ref["t"]) < 1e-6
    np.testing.assert_array_equal(ref["u_mask"] <= ref["t"], ref["xt"] == MASK)


@pytest.mark.parametrize("name", CASES)
def test_loss_and_gradient_match_bd3lm(name: str) -> None:
    ref, _, eps_min, _ = _case(name)
    logits = jnp.asarray(ref["logits"])
    loss, nlls = _token_loss(logits, ref, eps_min)
    scale = max(1.0, float(np.abs(ref["nlls"]).max()))
    assert _diff(nlls, ref["nlls"]) <= 2e-6 * scale
    assert float(loss) == pytest.approx(float(ref["loss"]), rel=2e-6)
    grad = jax.grad(lambda x: _token_loss(x, ref, eps_min)[0])(logits)
    assert _diff(grad, ref["grad_logits"]) <= 2e-6 * max(1.0, np.abs(ref["grad_logits"]).max())


@pytest.fixture(scope="module")
def decoder_mask():  # noqa: ANN201
    """The decoder's own two-copy mask ``[2L, 2L]`` for a block size, one row, no padding."""
    model = tiny_decoder(V, L)
    variables = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    seg = jnp.ones((1, 2 * L), jnp.int32)
    pos = jnp.tile(jnp.arange(L, dtype=jnp.int32), 2)[None]

    def build(size: int) -> np.ndarray:
        rule = lambda m: m._mask(seg, pos, False, size, True)  # noqa: E731
        return np.asarray(model.apply(variables, method=rule))[0]

    return build


@pytest.mark.parametrize("name", CASES)
def test_two_copy_mask_matches_block_diff_mask(name: str, decoder_mask) -> None:  # noqa: ANN001
    ref, size, _, _ = _case(name)
    idx = jnp.arange(2 * L)
    pos = idx % L
    rule = two_copy_visible(idx[:, None], idx[None, :], pos[:, None], pos[None, :], size, L)
    np.testing.assert_array_equal(np.asarray(rule), ref["attention_mask_2L"] == 1)
    np.testing.assert_array_equal(decoder_mask(size), ref["attention_mask_2L"] == 1)

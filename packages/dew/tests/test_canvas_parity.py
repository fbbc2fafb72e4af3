"""Canvas generation against MDLM's and LLaDA's own samplers (tools/parity_canvas.py).

The fixture holds, per case, what the verbatim reference code did with a fixed logits
function (``table[l] + pair[x[l - 1]]``, no network) and a recorded stream of uniform
draws: the final canvas and the step at which each position was unmasked. Here Dew's loop
(``dew.inference.canvas.loop.fill``) reads the same logits function and the same draws
(LLaDA's float64 draws rounded to float32), and must unmask the same positions at the same
steps with the same tokens. The fixture's ``margin`` is the smallest relative gap between
the best and second-best score of any token the reference drew (>= 4e-3 here) and, for
LLaDA, ``rank_margin`` the smallest relative gap between the last confidence kept and the
next (>= 1.3e-3): both far above the float32 rounding (~1e-7) that could flip a decision.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.inference.canvas import Canvas
from dew.inference.canvas.loop import fill
from dew.objectives.diffusion import LogLinearSchedule
from dew.sampling import Sampling

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "canvas"
SIDECAR = json.loads((FIXTURES / "canvas.json").read_text())
with np.load(FIXTURES / "canvas.npz") as _z:
    REF = {k: _z[k] for k in _z.files}
MASK = SIDECAR["mask_id"]


def _run(name: str, canvas: Canvas, sampling: Sampling, start: np.ndarray, prompt: int):
    table, pair = jnp.asarray(REF[f"{name}/table"]), jnp.asarray(REF[f"{name}/pair"])
    draws = jnp.asarray(REF[f"{name}/draws"].astype(np.float32))

    def logits_fn(x):
        return table[None] + pair[jnp.roll(x, 1, axis=1)]

    if not draws.shape[0]:  # greedy: LLaDA drew nothing
        draws = jnp.zeros((1, *start.shape, table.shape[1]), jnp.float32)

    def draw(index):
        return draws[index]

    run = jax.jit(lambda ids: fill(logits_fn, ids, prompt, canvas, sampling, draw))
    return jax.device_get(run(jnp.asarray(start, jnp.int32)))


@pytest.mark.parametrize("name", sorted(SIDECAR["mdlm"]["cases"]))
def test_ancestral_matches_mdlm(name: str) -> None:
    _, batch, length, steps, eps, _ = SIDECAR["mdlm"]["cases"][name]
    canvas = Canvas(MASK, MASK, steps, "ancestral", schedule=LogLinearSchedule(), eps=eps)
    start = np.full((batch, length), MASK, np.int32)
    ids, order = _run(name, canvas, Sampling(temperature=1.0), start, 0)
    np.testing.assert_array_equal(order, REF[f"{name}/order"])
    np.testing.assert_array_equal(ids, REF[f"{name}/final"])
    if eps > 0.1:  # the last step leaves ~eps of the canvas masked for noise removal
        assert (order == steps).any(), "noise removal filled nothing: the case tests less"
    assert float(REF[f"{name}/margin"]) > 1e-3


@pytest.mark.parametrize("name", sorted(SIDECAR["llada"]["cases"]))
def test_low_confidence_matches_llada(name: str) -> None:
    batch, prompt_len, gen, block, steps, temperature, _ = SIDECAR["llada"]["cases"][name]
    canvas = Canvas(MASK, MASK, steps, "low_confidence", block_length=block)
    prompt = REF[f"{name}/prompt"]
    start = np.concatenate([prompt, np.full((batch, gen), MASK, np.int32)], axis=1)
    ids, order = _run(name, canvas, Sampling(temperature=temperature), start, prompt_len)
    np.testing.assert_array_equal(order, REF[f"{name}/order"])
    np.testing.assert_array_equal(ids, REF[f"{name}/final"])
    assert min(float(REF[f"{name}/margin"]), float(REF[f"{name}/rank_margin"])) > 5e-4


def test_the_loop_is_not_a_copy_of_the_fixture() -> None:
    """Other draws give another canvas: the test above compares what the draws decide."""
    name = "llada_blocks"
    batch, prompt_len, gen, block, steps, temperature, _ = SIDECAR["llada"]["cases"][name]
    canvas = Canvas(MASK, MASK, steps, "low_confidence", block_length=block)
    prompt = REF[f"{name}/prompt"]
    start = np.concatenate([prompt, np.full((batch, gen), MASK, np.int32)], axis=1)
    saved = REF[f"{name}/draws"]
    REF[f"{name}/draws"] = saved[::-1].copy()
    try:
        ids, _ = _run(name, canvas, Sampling(temperature=temperature), start, prompt_len)
    finally:
        REF[f"{name}/draws"] = saved
    assert not np.array_equal(ids, REF[f"{name}/final"])

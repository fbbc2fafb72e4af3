"""Scanned decoder layers (``DecoderConfig.scan_layers``, ``dew.models.scan``).

The scanned forward pass computes the unrolled loop's logits, gradients and prefill
caches (float32, within 1e-5) from the same parameter tree, in the causal, packed,
remat and block-diffusion modes, on the serving layout and under LoRA (which falls back
to the loop); and its compiled program holds one layer body in a loop, so it is shorter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import models
from dew.models.lora import LoraConfig, apply_adapters, init_adapters
from dew.models.scan import stack_layers
from dew.models.serving import fuse

SMALL = dict(vocab_size=64, emb_features=32, num_layers=4, num_heads=4, num_kv_heads=2,
             mlp_features=64, max_seq_len=32, qk_norm=True)  # fmt: skip
IDS = jax.random.randint(jax.random.key(0), (2, 16), 0, 64)
SEGMENTS = jnp.array([[1] * 6 + [2] * 8 + [0] * 2, [1] * 16], jnp.int32)
POSITIONS = jnp.array([list(range(6)) + list(range(8)) + [0, 0], list(range(16))], jnp.int32)
TOL = 1e-5


def _pair(**options: object) -> tuple[models.CausalTransformer, models.CausalTransformer]:
    loop = models.build("qwen3", **SMALL, **options)
    return loop, models.build("qwen3", scan_layers=True, **SMALL, **options)


@pytest.fixture(scope="module")
def params() -> dict:
    model = models.build("qwen3", **SMALL)
    return jax.jit(model.init)(jax.random.key(1), IDS)["params"]


def _close(a: object, b: object) -> float:
    """The largest absolute difference over two trees, asserted <= TOL."""
    worst = max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    print(f"max |scan - loop| {worst:.2e}")  # shown with -s
    assert worst <= TOL, worst
    return worst


CASES = {
    "causal": ({}, {}),
    "segments": ({}, {"segment_ids": SEGMENTS, "positions": POSITIONS}),
    "remat_full": ({"remat": "full"}, {"segment_ids": SEGMENTS, "positions": POSITIONS}),
    "block_diffusion": ({}, {"causal": False, "block_size": 4}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_gradients_match_the_loop(params: dict, case: str) -> None:
    options, kwargs = CASES[case]
    loop, scan = _pair(**options)

    def loss(model: models.CausalTransformer):
        def value(p: dict) -> jax.Array:
            logits = model.apply({"params": p}, IDS, **kwargs)
            logp = jax.nn.log_softmax(logits)
            return -jnp.take_along_axis(logp, IDS[..., None], axis=-1).mean()

        return value

    _close(
        scan.apply({"params": params}, IDS, **kwargs), loop.apply({"params": params}, IDS, **kwargs)
    )
    got = jax.jit(jax.value_and_grad(loss(scan)))(params)
    want = jax.jit(jax.value_and_grad(loss(loop)))(params)
    _close(got, want)


def test_hidden_states_match(params: dict) -> None:
    loop, scan = _pair()
    _close(
        scan.apply({"params": params}, IDS, method="hidden_states"),
        loop.apply({"params": params}, IDS, method="hidden_states"),
    )


@pytest.mark.parametrize("layout", ["training", "serving"])
def test_prefill_caches_match(params: dict, layout: str) -> None:
    loop, scan = _pair()
    variables = {"params": params}
    if layout == "serving":
        variables = fuse(variables, loop.config)
    lengths = jnp.array([16, 9], jnp.int32)
    want = loop.apply(variables, IDS, lengths, 20, method="prefill")
    got = scan.apply(variables, IDS, lengths, 20, method="prefill")
    _close(got, want)
    assert len(got[1].keys) == SMALL["num_layers"]


def test_lora_falls_back_to_the_loop(params: dict) -> None:
    loop, scan = _pair()
    lora = LoraConfig(rank=2, alpha=4.0)
    adapters = init_adapters(jax.random.key(2), loop.config, lora)
    adapters = jax.tree.map(lambda a: a + 0.1, adapters)  # b != 0: the adapter counts
    want = apply_adapters(loop, {"params": params}, adapters, lora, IDS)
    got = apply_adapters(scan, {"params": params}, adapters, lora, IDS)
    _close(got, want)
    assert float(jnp.abs(want - loop.apply({"params": params}, IDS)).max()) > 1e-3


def test_init_gives_the_same_parameter_tree(params: dict) -> None:
    _, scan = _pair()
    fresh = jax.jit(scan.init)(jax.random.key(1), IDS)["params"]
    assert jax.tree.structure(fresh) == jax.tree.structure(params)
    assert sorted(k for k in fresh if k.startswith("layers_")) == [f"layers_{i}" for i in range(4)]
    for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_compiled_program_has_one_layer_body(params: dict) -> None:
    loop, scan = _pair()

    def text(model: models.CausalTransformer) -> str:
        def loss(p: dict) -> jax.Array:
            return model.apply({"params": p}, IDS).mean()

        return jax.jit(jax.grad(loss)).lower(params).as_text()

    looped, scanned = text(loop), text(scan)
    # A silent fallback to the loop gives the same program and fails both.
    assert looped.count("stablehlo.while") != scanned.count("stablehlo.while")
    assert len(scanned) < len(looped)


def test_scan_layers_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match=r"^scan_layers: expected a bool, got 1$"):
        models.build("qwen3", scan_layers=1, **SMALL)


def test_layers_of_different_shapes_are_refused(params: dict) -> None:
    odd = dict(params["layers_2"], extra={"kernel": jnp.zeros((2,))})
    with pytest.raises(ValueError, match=r"^layers_1: expected the parameter structure"):
        stack_layers([params["layers_0"], odd])

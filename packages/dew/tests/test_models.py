"""Decoder contract: shapes, packed-row isolation, cache prefill/decode, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dew import models

CONFIG = dict(
    vocab_size=48,
    emb_features=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    mlp_features=48,
    max_seq_len=32,
)


@pytest.fixture(scope="module")
def qwen3():
    model = models.build("qwen3", **CONFIG, tie_embeddings=False, rope_theta=5000.0)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    apply = jax.jit(model.apply)
    return model, variables, apply


def test_build_contract(qwen3):
    model, variables, apply = qwen3
    assert set(variables) == {"params"}
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
    logits = apply(variables, ids)
    assert logits.shape == (2, 6, CONFIG["vocab_size"]) and logits.dtype == jnp.float32
    assert "lm_head" in variables["params"]
    assert "q_norm" in variables["params"]["layers_0"]["self_attn"]


def test_packed_chains_match_separate_rows(qwen3):
    _, variables, apply = qwen3
    ids = jnp.array([[5, 6, 7, 8, 9, 10, 0, 0]], jnp.int32)
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 0, 0]], jnp.int32)
    pos = jnp.array([[0, 1, 2, 0, 1, 2, 0, 0]], jnp.int32)
    packed = apply(variables, ids, seg, pos)
    first = apply(variables, ids[:, :3])
    second = apply(variables, ids[:, 3:6])
    np.testing.assert_allclose(packed[0, :3], first[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed[0, 3:6], second[0], rtol=1e-5, atol=1e-6)
    assert np.isfinite(np.asarray(packed)).all()


def test_hidden_states_reachable(qwen3):
    model, variables, _ = qwen3
    ids = jnp.array([[1, 2, 3]], jnp.int32)
    hidden = model.apply(variables, ids, method="hidden_states")
    logits, hidden2 = model.apply(variables, ids, return_hidden=True)
    assert hidden.shape == (1, 3, CONFIG["emb_features"])
    np.testing.assert_array_equal(hidden, hidden2)
    np.testing.assert_allclose(
        model.apply(variables, hidden, method="logits_from_hidden"), logits, rtol=1e-6
    )


def test_prefill_decode_match_full_forward(qwen3):
    model, variables, apply = qwen3
    prompts = [[3, 4, 5], [9, 8, 7, 6, 5]]
    width = 5
    padded = jnp.array([[0] * (width - len(p)) + p for p in prompts], jnp.int32)
    lengths = jnp.array([len(p) for p in prompts], jnp.int32)
    last, cache = model.apply(variables, padded, lengths, 12, method="prefill")
    assert cache.capacity == 12 and list(cache.lengths) == [3, 5]
    for row, prompt in enumerate(prompts):
        full = apply(variables, jnp.array([prompt], jnp.int32))
        np.testing.assert_allclose(last[row], full[0, -1], rtol=1e-5, atol=1e-5)
    logits, cache2 = model.apply(
        variables, jnp.array([11, 12]), cache, jnp.array([True, False]), method="decode"
    )
    full = apply(variables, jnp.array([prompts[0] + [11]], jnp.int32))
    np.testing.assert_allclose(logits[0], full[0, -1], rtol=1e-5, atol=1e-5)
    assert list(cache2.lengths) == [4, 5]
    for old, new in zip(cache.keys + cache.values, cache2.keys + cache2.values):
        np.testing.assert_array_equal(old[1], new[1])  # inactive row untouched
        assert not np.array_equal(old[0], new[0])


def test_bfloat16_compute_keeps_float32_params_and_logits(qwen3):
    _, variables, apply = qwen3
    model16 = models.build(
        "qwen3", **CONFIG, tie_embeddings=False, rope_theta=5000.0, dtype="bfloat16"
    )
    ids = jnp.array([[1, 2, 3, 4]], jnp.int32)
    logits16 = model16.apply(variables, ids)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, apply(variables, ids), atol=0.1)


def test_families_and_softcap():
    assert {"causal_transformer", "llama", "qwen3"} <= set(models.families())
    model = models.build("llama", **CONFIG, logit_softcap=0.5)
    ids = jnp.array([[1, 2]], jnp.int32)
    variables = model.init(jax.random.key(1), ids)
    assert "lm_head" in variables["params"]
    logits = model.apply(variables, ids)
    assert float(jnp.abs(logits).max()) <= 0.5


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"dtype": "int8"}, "dtype"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "rope_type"),
    ],
)
def test_bad_config_names_field(change, field):
    with pytest.raises(ValueError, match=field):
        models.build("causal_transformer", **{**CONFIG, **change})


def test_bad_names_and_inputs(qwen3):
    with pytest.raises(ValueError, match="unknown model family"):
        models.build("gpt17", **CONFIG)
    with pytest.raises(TypeError, match="emb_width"):
        models.build("llama", emb_width=3, **CONFIG)
    model, variables, _ = qwen3
    ids = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="segment_ids"):
        model.apply(variables, ids, jnp.ones((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="max_seq_len"):
        model.apply(variables, jnp.zeros((1, 40), jnp.int32))
    with pytest.raises(ValueError, match="input_ids"):
        model.apply(variables, jnp.zeros((1, 4), jnp.float32))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_packing_property(qwen3, lengths, seed):
    """Any packing of chains into a row gives each chain the logits it has alone."""
    _, variables, apply = qwen3
    width = 12
    total = 0
    kept = []
    for n in lengths:
        if total + n <= width:
            kept.append(n)
            total += n
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CONFIG["vocab_size"], size=(1, width)).astype(np.int32)
    seg = np.zeros((1, width), np.int32)
    pos = np.zeros((1, width), np.int32)
    start = 0
    for k, n in enumerate(kept):
        seg[0, start : start + n] = k + 1
        pos[0, start : start + n] = np.arange(n)
        start += n
    packed = np.asarray(apply(variables, ids, seg, pos))
    start = 0
    for n in kept:
        alone_ids = np.zeros((1, width), np.int32)
        alone_ids[0, :n] = ids[0, start : start + n]
        alone_seg = (np.arange(width) < n).astype(np.int32)[None]
        alone_pos = np.where(alone_seg > 0, np.arange(width), 0).astype(np.int32)
        alone = np.asarray(apply(variables, alone_ids, alone_seg, alone_pos))
        np.testing.assert_allclose(packed[0, start : start + n], alone[0, :n], rtol=1e-5, atol=1e-5)
        start += n


def test_decode_window_equals_full_cache(qwen3):
    """A window only skips empty slots. The first layer writes the same cache bit for
    bit (its key and value come before any attention); the logits and the later layers'
    entries agree to float32 rounding (XLA's CPU kernels may sum a product of another
    width in another order, so bit equality is not promised)."""
    model, variables, _ = qwen3
    padded = jnp.array([[0, 3, 4, 5], [9, 8, 7, 6]], jnp.int32)
    _, cache = model.apply(variables, padded, jnp.array([3, 4]), 24, method="prefill")
    tokens = jnp.array([1, 2])
    full, c1 = model.apply(variables, tokens, cache, method="decode")
    windowed, c2 = model.apply(variables, tokens, cache, None, 8, method="decode")
    np.testing.assert_allclose(full, windowed, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(c1.keys[0], c2.keys[0])
    np.testing.assert_array_equal(c1.values[0], c2.values[0])
    for a, b in zip(c1.keys + c1.values, c2.keys + c2.values):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(c1.lengths, c2.lengths)


@pytest.mark.parametrize("tie", [True, False])
def test_serving_layout_computes_the_same_function(tie):
    from dew.models.serving import fuse

    model = models.build("qwen3", **CONFIG, tie_embeddings=tie)
    ids = jnp.array([[1, 2, 3, 4, 5]], jnp.int32)
    variables = model.init(jax.random.key(2), ids)
    fused = fuse(variables, model.config)
    mlp = fused["params"]["layers_1"]["mlp"]
    assert sorted(mlp) == ["down_proj", "gate_up_kernel"]
    assert mlp["gate_up_kernel"].shape == (CONFIG["emb_features"], 2 * CONFIG["mlp_features"])
    assert fused["params"]["head_kernel"].shape == (CONFIG["emb_features"], CONFIG["vocab_size"])
    np.testing.assert_allclose(model.apply(fused, ids), model.apply(variables, ids), atol=1e-6)
    assert "gate_proj" in variables["params"]["layers_1"]["mlp"]  # input left alone


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rotary_gradient_matches_the_generic_rule(dtype) -> None:
    # apply_rotary writes its backward pass out; it must equal autodiff of the same formula,
    # for the input and for both tables.
    from dew.models.rope import apply_rotary

    def generic(x, cos, sin):
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, :, None, :].astype(x.dtype) + rotated * sin[:, :, None, :].astype(x.dtype)

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 3, 4, 8)), dtype)
    cos = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.float32)
    sin = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.float32)
    weights = jnp.asarray(rng.standard_normal((2, 3, 4, 8)), jnp.float32)

    def loss(fn):
        return lambda *a: jnp.sum(weights * fn(*a).astype(jnp.float32))

    ours = jax.grad(loss(apply_rotary), argnums=(0, 1, 2))(x, cos, sin)
    want = jax.grad(loss(generic), argnums=(0, 1, 2))(x, cos, sin)
    np.testing.assert_array_equal(
        np.asarray(apply_rotary(x, cos, sin)), np.asarray(generic(x, cos, sin))
    )
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    for got, ref in zip(ours, want):
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(ref, np.float32), rtol=tol, atol=tol
        )

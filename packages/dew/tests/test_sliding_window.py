"""Sliding-window attention: the visibility rule, training, cached decoding, config.json.

The parity with transformers' Mistral is pinned by the `mistral_sliding` fixture
(window 4, 12 scored tokens, generations to 19 tokens) in test_models_hf.py and
test_generation.py; here the window is checked against its own definition.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import models
from dew.models import layers, load_pretrained
from dew.models.hf_names import decoder_config, hf_config
from dew.models.layers import visible

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"
CONFIG = dict(
    vocab_size=48,
    emb_features=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    mlp_features=48,
    max_seq_len=320,
    tie_embeddings=False,
)


def _mask(length: int, window: int | None) -> np.ndarray:
    idx = jnp.arange(length)
    return np.asarray(visible(idx[:, None], idx[None, :], window))


@pytest.fixture(scope="module")
def mistral():
    model = models.build("mistral", **CONFIG, sliding_window=3)
    variables = model.init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32))
    return model, variables, jax.jit(model.apply)


def test_mask_is_causal_when_the_window_covers_the_sequence():
    causal = np.tril(np.ones((9, 9), bool))
    np.testing.assert_array_equal(_mask(9, None), causal)
    for window in (9, 10, 1000):
        np.testing.assert_array_equal(_mask(9, window), causal)
    for window in (1, 2, 4, 8):
        expected = np.array([[i - window < j <= i for j in range(9)] for i in range(9)])
        got = _mask(9, window)
        np.testing.assert_array_equal(got, expected)
        assert not np.array_equal(got, causal)
        assert got.sum(axis=1).max() == window  # each query sees at most W keys
    np.testing.assert_array_equal(_mask(4, 1), np.eye(4, dtype=bool))


@pytest.mark.parametrize("window", [0, -3, True, 2.5, "4"])
def test_non_positive_window_is_refused(window):
    with pytest.raises(ValueError) as error:
        models.build("mistral", **CONFIG, sliding_window=window)
    assert str(error.value) == (f"sliding_window: expected a positive int or None, got {window!r}")


def test_packed_segments_keep_their_own_windows(mistral):
    _, variables, apply = mistral
    ids = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 0]], jnp.int32)
    seg = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2, 2, 0]], jnp.int32)
    pos = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0]], jnp.int32)
    packed = apply(variables, ids, seg, pos)
    np.testing.assert_allclose(packed[0, :5], apply(variables, ids[:, :5])[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 5:9], apply(variables, ids[:, 5:9])[0], atol=1e-5)
    assert np.isfinite(np.asarray(packed)).all()


def test_query_chunks_skip_only_hidden_keys(mistral, monkeypatch):
    """Past QUERY_CHUNK positions a chunk reads keys from its window's start only; one
    chunk over the whole row gives the same logits."""
    model, variables, _ = mistral
    ids = jax.random.randint(jax.random.key(2), (2, 300), 0, CONFIG["vocab_size"])
    for window in (1, 3, 200):
        cfg = model.config.replace(sliding_window=window)
        chunked = models.build("mistral", config=cfg).apply(variables, ids)
        monkeypatch.setattr(layers, "QUERY_CHUNK", 512)
        whole = models.build("mistral", config=cfg).apply(variables, ids)
        monkeypatch.setattr(layers, "QUERY_CHUNK", 128)
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)


def test_cached_decoding_past_the_window_equals_full_recompute(mistral):
    model, variables, apply = mistral
    prompts = [[3, 4, 5, 6, 7], [9, 8]]
    padded = jnp.array([[0] * (5 - len(p)) + p for p in prompts], jnp.int32)
    logits, cache = model.apply(variables, padded, jnp.array([5, 2]), 16, method="prefill")
    step = jax.jit(lambda v, t, c: model.apply(v, t, c, None, 16, method="decode"))
    rows = [list(p) for p in prompts]
    for _ in range(8):  # both rows end well past the 3-token window
        for row, tokens in enumerate(rows):
            full = apply(variables, jnp.array([tokens], jnp.int32))
            np.testing.assert_allclose(logits[row], full[0, -1], rtol=1e-5, atol=1e-5)
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        for row, tokens in enumerate(rows):
            tokens.append(int(token[row]))
        logits, cache = step(variables, token, cache)
    # The window bites: the same weights with full attention score differently.
    full_attention = models.build("mistral", config=model.config.replace(sliding_window=None))
    tokens = jnp.array([rows[0]], jnp.int32)
    assert np.abs(full_attention.apply(variables, tokens) - apply(variables, tokens)).max() > 1e-3


def test_fixture_window_changes_transformers_logits():
    """Dropping the window from the Mistral fixture moves Dew away from the recorded
    logits, so their agreement depends on the window."""
    pretrained = load_pretrained(FIXTURES / "mistral_sliding")
    recorded = np.load(FIXTURES / "mistral_sliding.npz")
    assert pretrained.config.sliding_window == 4 and recorded["ids"].shape[1] >= 12
    model = models.build("mistral", config=pretrained.config.replace(sliding_window=None))
    full = np.asarray(model.apply(pretrained.variables, recorded["ids"]))
    assert np.abs(full - recorded["logits"]).max() > 1e-2


def test_cached_decoding_matches_transformers_past_the_window():
    """Prefill the first 9 recorded tokens, then decode the 10 greedy ones one by one:
    each step's logits equal transformers' uncached logits at that position, though
    the 4-token window slid past the prompt's start long before."""
    pretrained = load_pretrained(FIXTURES / "mistral_sliding")
    recorded = np.load(FIXTURES / "mistral_sliding.npz")
    ids, reference = recorded["decode_ids"], recorded["decode_logits"][0]
    model, variables = pretrained.model, pretrained.variables
    prompt = 9
    logits, cache = model.apply(
        variables, jnp.asarray(ids[:, :prompt]), jnp.array([prompt]), 24, method="prefill"
    )
    step = jax.jit(lambda v, t, c: model.apply(v, t, c, method="decode"))
    got = [np.asarray(logits[0])]
    for position in range(prompt, ids.shape[1] - 1):
        logits, cache = step(variables, jnp.asarray(ids[:, position]), cache)
        got.append(np.asarray(logits[0]))
    expected = reference[prompt - 1 : ids.shape[1] - 1]
    np.testing.assert_allclose(np.stack(got), expected, rtol=1e-4, atol=1e-5)
    assert np.abs(np.stack(got) - expected).max() <= 1e-4 * np.abs(expected).max()
    assert [int(row.argmax()) for row in got] == ids[0, prompt:].tolist()


def _mistral_json(**changes) -> dict:
    hf = json.loads((FIXTURES / "mistral_sliding" / "config.json").read_text())
    return {**hf, **changes}


def test_config_json_windows_read_and_written():
    assert decoder_config(_mistral_json())[1].sliding_window == 4
    assert decoder_config(_mistral_json(sliding_window=None))[1].sliding_window is None
    # as transformers' Mistral: use_sliding_window is ignored, an absent window is 4096
    off = _mistral_json(use_sliding_window=False)
    assert decoder_config(off)[1].sliding_window == 4
    absent = {k: v for k, v in _mistral_json().items() if k != "sliding_window"}
    assert decoder_config(absent)[1].sliding_window == 4096
    with pytest.raises(ValueError, match=r"config.json sliding_window: expected a positive"):
        decoder_config(_mistral_json(sliding_window=0))
    family, cfg = decoder_config(_mistral_json())
    assert hf_config(cfg, family)["sliding_window"] == 4
    assert hf_config(cfg.replace(sliding_window=None), family)["sliding_window"] is None
    with pytest.raises(ValueError, match=r"sliding_window=4 cannot be written as Llama"):
        hf_config(cfg, "llama")
    qwen2 = json.loads((FIXTURES / "qwen2_tied" / "config.json").read_text())
    assert decoder_config(dict(qwen2, sliding_window=8))[1].sliding_window is None
    with pytest.raises(ValueError, match="use_sliding_window.*Mistral"):
        decoder_config(dict(qwen2, sliding_window=8, use_sliding_window=True))

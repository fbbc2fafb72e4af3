"""TextGeneration: greedy equality with transformers, likelihood bookkeeping, buckets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.inference import TextGeneration
from dew.models import load_pretrained
from dew.sampling import Sampling

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"
PROMPTS = [[5, 17, 99, 3, 42], [7, 1, 2, 3, 4, 5, 6, 8, 9], [100, 101, 102]]
GREEDY = Sampling(temperature=0.0)


def _rows(recorded, name):
    return [row[:n].tolist() for row, n in zip(recorded[name], recorded[f"{name}_lengths"])]


@pytest.mark.parametrize(
    "case",
    [
        "qwen3_tied",
        "qwen3_untied_sharded",
        "llama3_untied",
        "llama_linear_tied",
        "qwen2_tied",
        "mistral_sliding",
    ],
)
def test_greedy_equals_transformers_generate(case):
    pretrained = load_pretrained(FIXTURES / case)
    recorded = np.load(FIXTURES / f"{case}.npz")
    policy = TextGeneration(pretrained.model, pretrained.variables)
    out = policy(PROMPTS, 10, jax.random.key(0), GREEDY)
    assert [g.ids.tolist() for g in out] == _rows(recorded, "greedy")
    assert not any(g.eos for g in out)
    for g in out:
        assert np.all(g.behavior_log_probs == 0.0) and np.all(g.raw_log_probs < 0)


@pytest.fixture(scope="module")
def qwen3():
    pretrained = load_pretrained(FIXTURES / "qwen3_tied")
    return pretrained, TextGeneration(pretrained.model).bind(pretrained.variables)


def test_greedy_stops_at_eos_like_transformers(qwen3):
    pretrained, policy = qwen3
    recorded = np.load(FIXTURES / "qwen3_tied.npz")
    eos = int(recorded["eos_id"])
    out = policy(PROMPTS, 10, jax.random.key(0), Sampling(temperature=0.0, eos_id=(eos, 127)))
    expected = _rows(recorded, "greedy_eos")
    assert [g.ids.tolist() for g in out] == expected
    assert [g.eos for g in out] == [row[-1] == eos for row in expected]
    assert out[0].eos and out[0].ids[-1] == eos and out[0].finish_reason == "eos"


def test_no_recompile_across_lengths_budgets_and_keys(qwen3):
    _, policy = qwen3
    sampling = Sampling(temperature=1.0, top_k=8)
    before = policy.compile_count
    lengths = []
    for i, (n, budget) in enumerate([(3, 5), (9, 16), (14, 1), (1, 11)]):
        out = policy([list(range(1, n + 1))], [budget], jax.random.key(i), sampling)
        lengths.append(len(out[0]))
        assert len(out[0]) <= budget
    assert lengths[2] == 1 and lengths[1] == 16
    assert policy.compile_count == before + 1
    policy(list(range(20)), 5, 3, sampling)  # wider context: one more bucket
    assert policy.compile_count == before + 2


def test_likelihoods_match_full_forward_rescoring(qwen3):
    pretrained, policy = qwen3
    sampling = Sampling(temperature=0.7, top_k=6, return_support=True)
    contexts = [[3, 4, 5, 6], [9, 10]]
    out = policy(contexts, 8, jax.random.key(5), sampling)
    for context, gen in zip(contexts, out):
        assert gen.support.shape == (len(gen), 6)
        chain = jnp.array([context + gen.ids.tolist()], jnp.int32)
        logits = pretrained.model.apply(pretrained.variables, chain)[0, len(context) - 1 : -1]
        raw = jax.nn.log_softmax(logits)
        ids = jnp.asarray(gen.ids)
        np.testing.assert_allclose(gen.raw_log_probs, raw[jnp.arange(len(gen)), ids], atol=2e-5)
        top_vals, top_ids = jax.lax.top_k(logits / 0.7, 6)
        np.testing.assert_array_equal(gen.support, top_ids)
        behavior = jax.nn.log_softmax(top_vals)
        picked = jnp.argmax(top_ids == ids[:, None], axis=-1)
        np.testing.assert_allclose(
            gen.behavior_log_probs, behavior[jnp.arange(len(gen)), picked], atol=2e-5
        )


def test_same_key_same_draws_and_batch_padding(qwen3):
    _, policy = qwen3
    sampling = Sampling(temperature=1.0)
    a = policy([[1, 2, 3], [4, 5], [6]], 6, jax.random.key(9), sampling)
    b = policy([[1, 2, 3], [4, 5], [6]], 6, jax.random.key(9), sampling)
    assert [g.ids.tolist() for g in a] == [g.ids.tolist() for g in b]
    single = policy(np.array([1, 2, 3]), 6, jax.random.key(9), sampling)
    assert single.ids.shape == (6,)


def test_bind_accepts_state_objects_and_errors(qwen3):
    pretrained, _ = qwen3
    policy = TextGeneration(pretrained.model)
    with pytest.raises(RuntimeError, match="bind"):
        policy([1, 2], 3, 0, GREEDY)
    policy.bind(SimpleNamespace(params=pretrained.variables))
    with pytest.raises(TypeError, match="snapshot"):
        policy.bind({"weights": 1})
    with pytest.raises(ValueError, match=r"max_new_tokens\[0\]"):
        policy([1, 2], 0, 0, GREEDY)
    with pytest.raises(ValueError, match=r"context_ids\[0\].*\[0, 128\)"):
        policy([1, 200], 3, 0, GREEDY)
    with pytest.raises(ValueError, match="max_seq_len"):
        policy([1, 2], 300, 0, GREEDY)
    with pytest.raises(ValueError, match="one budget per context"):
        policy([[1], [2]], [3], 0, GREEDY)
    with pytest.raises(TypeError, match="sampling"):
        policy([1, 2], 3, 0, {"temperature": 0})


def test_long_budget_runs_through_attention_windows(qwen3):
    """A budget past 128 positions crosses a window boundary inside one program and
    matches step-by-step decoding on the full cache."""
    from dew.inference.generation import attention_windows

    pretrained, policy = qwen3
    assert attention_windows(16, 16 + 256) == [128, 272]
    context = [3, 1, 4, 1, 5]
    out = policy(context, 140, jax.random.key(0), GREEDY)
    assert len(out) == 140
    model, variables = pretrained.model, pretrained.variables
    padded = jnp.array([[0] * 11 + context], jnp.int32)
    logits, cache = model.apply(variables, padded, jnp.array([5]), 272, method="prefill")
    step = jax.jit(lambda v, t, c: model.apply(v, t, c, method="decode"))
    expected = []
    for _ in range(140):
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        expected.append(int(token[0]))
        logits, cache = step(variables, token, cache)
    assert out.ids.tolist() == expected

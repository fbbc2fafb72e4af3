"""NativeRolloutServer serving a base with a LoRA adapter applied on the fly: each draw's
log-probs are the `LoraDecoder`'s teacher-forced ones, and `load` swaps in a new adapter
beside the same base (the draws then score under the new adapter, at the new version)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dew.inference import Server
from dew.inference.adapter import with_adapter
from dew.models import build
from dew.models.lora import LoraConfig, init_adapters
from dew.rollout import NativeRolloutServer
from dew.sampling import Sampling

SHAPE = dict(vocab_size=32, emb_features=16, num_layers=1, num_heads=2, num_kv_heads=1,
             mlp_features=32, max_seq_len=64, tie_embeddings=False)  # fmt: skip
LORA = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7]]
NEW = 6
WIDTH = 16  # every prompt + draw fits; right padding leaves the scored positions alone


def _random(adapters, seed):
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )


@pytest.fixture(scope="module")
def served():
    """The base, two random adapters, a served LoraDecoder and a jitted scorer of chains."""
    base = build("llama", **SHAPE)
    variables = base.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    fresh = init_adapters(jax.random.key(1), base.config, LORA)
    first, second = _random(fresh, 2), _random(fresh, 3)
    model, lora_variables = with_adapter(base, variables, first, LORA)
    server = Server(model, lora_variables, slots=2, capacity=32, min_window=32,
                    sampling=Sampling(temperature=1.0))  # fmt: skip
    log_probs = jax.jit(lambda v, ids: jax.nn.log_softmax(model.apply(v, ids), axis=-1))
    with NativeRolloutServer(server) as rollout:
        yield {"rollout": rollout, "params": variables["params"], "first": first,
               "second": second, "log_probs": log_probs}  # fmt: skip


def _scored(served, adapters, draws):
    """The LoraDecoder's log-prob of each drawn id, from one forward over prompt + draw."""
    chains = np.zeros((len(draws), WIDTH), np.int32)
    for row, (prompt, draw) in enumerate(zip(PROMPTS, draws)):
        chain = [*prompt, *draw.ids.tolist()]
        chains[row, : len(chain)] = chain
    variables = {"params": adapters, "base": served["params"]}
    scores = np.asarray(served["log_probs"](variables, chains))
    return [
        scores[row, len(prompt) - 1 + np.arange(len(draw.ids)), draw.ids]
        for row, (prompt, draw) in enumerate(zip(PROMPTS, draws))
    ]


def _draw(rollout, seed):
    futures = [rollout.submit(p, NEW, seed=seed + i) for i, p in enumerate(PROMPTS)]
    return [f.result(timeout=300) for f in futures]


def test_draws_score_as_the_lora_decoder(served):
    draws = _draw(served["rollout"], 0)
    for draw, want in zip(draws, _scored(served, served["first"], draws)):
        assert draw.version == 0 and len(draw.ids) == NEW
        np.testing.assert_allclose(draw.raw_log_probs, want, atol=1e-5)
    # the adapter matters: another adapter scores the same ids differently
    other = _scored(served, served["second"], draws)
    assert any(not np.allclose(d.raw_log_probs, o, atol=1e-3) for d, o in zip(draws, other))


def test_load_swaps_the_adapter_and_keeps_the_base(served):
    rollout = served["rollout"]
    rollout.load({"params": served["second"], "base": served["params"]}, 1)
    draws = _draw(rollout, 10)
    for draw, want in zip(draws, _scored(served, served["second"], draws)):
        assert draw.version == 1
        np.testing.assert_allclose(draw.raw_log_probs, want, atol=1e-5)

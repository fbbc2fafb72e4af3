"""The guide's reward-function GRPO example, on local data and a tiny decoder from scratch.

The guide continues a TinyStories decoder and rewards stories that mention a dog. Here the
"story" is a handful of token ids from a 12-id vocabulary, the decoder starts from random
weights, and the reward asks whether the ground-truth token appears in the completion. The
layout is the guide's: a ``Prompts``-shaped batch repeated forever, ``GRPOObjective`` with a
small KL to the frozen start, ``SampledRollout`` with four completions per prompt and a
decode function, ``Trainer.fit``. Before training about a third of sampled completions hold
the token; after the updates nearly all do.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import optax

from dew.data import Dataset
from dew.inference import TextGeneration
from dew.objectives.rl import GRPOObjective, SampledRollout
from dew.sampling import Sampling
from dew.testing import tiny_decoder
from dew.trainer import Trainer

VOCAB = 12
TARGET = 7  # the "dog" of the guide's example
WORDS = [f"w{i}" for i in range(VOCAB)]


def decode(ids) -> str:
    return " ".join(WORDS[int(i)] for i in ids)


def reward(data_source, completion, ground_truth, extra_info):
    return float(ground_truth in completion.split())


def sample_rate(model, variables, prompt, key, n=64) -> float:
    generation = TextGeneration(model, variables)
    drawn = generation([prompt] * n, 4, key, Sampling(temperature=1.0))
    return float(np.mean([TARGET in d.ids.tolist() for d in drawn]))


def test_reward_rises(tmp_path):
    prompt = [1, 2, 3, 4]  # "Once upon a time, there was a little"
    rows = 8
    prompt_batch = {
        "prompt": np.tile(np.array(prompt, dtype=np.int32), (rows, 1)),
        "prompt_length": np.full(rows, len(prompt), dtype=np.int32),
        "data_source": np.tile(
            np.frombuffer(b"toy-stories", dtype=np.uint8).astype(np.int32), (rows, 1)
        ),
        "ground_truth": np.tile(
            np.frombuffer(WORDS[TARGET].encode(), dtype=np.uint8).astype(np.int32), (rows, 1)
        ),
        "extra_info": np.zeros((rows, 0), dtype=np.int32),
    }
    model = tiny_decoder(VOCAB, 16, emb_features=32, mlp_features=64)
    start = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))
    data = Dataset(
        train=lambda partition: itertools.repeat(prompt_batch), val=None, records=rows, batch=rows
    )
    objective = GRPOObjective(model, seq_len=len(prompt) + 4 - 1, beta=0.01, pretrained=start)
    rollout = SampledRollout(
        objective,
        reward=reward,
        groups=4,
        max_new_tokens=4,
        sampling=Sampling(temperature=1.0),
        decode=decode,
    )
    history = []

    def recording(variables, batch, key):
        out = rollout(variables, batch, key)
        history.append(float(out["rewards"].mean()))
        return out

    before = sample_rate(model, start, prompt, jax.random.key(11))
    state = Trainer(
        objective, optax.adam(3e-2), key=jax.random.key(3), rollout=recording, progress=False
    ).fit(data, steps=20, log_every=5, run_dir=tmp_path / "run")
    after = sample_rate(model, jax.device_get(state.params), prompt, jax.random.key(11))

    print(f"completions holding the target: before {before:.2f}, after {after:.2f}")
    print("rollout reward per step:", " ".join(f"{r:.2f}" for r in history))
    assert len(history) == 20
    assert 0.1 < before < 0.6, before
    assert after >= 0.9, (before, after, history)
    assert np.mean(history[-5:]) > np.mean(history[:5]) + 0.3, history
    # the reference stayed where training started
    for a, b in zip(jax.tree.leaves(state.ema), jax.tree.leaves(start)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert any("reward/mean" in line for line in metrics)

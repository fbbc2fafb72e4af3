"""LoRA training through the ordinary Trainer: LM, DPO and GRPO (sampled by a SampledRollout)
learn with only the adapter changing, the base bit-identical and no optimizer state for it;
the reference is the adapter-off base; checkpoints leave the base out, record its identity,
refuse another base and resume bit-identically; the adapter exports in PEFT's layout."""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.data import Dataset, PreferencePairs
from dew.data.prompts import encode_text
from dew.models.lora import LoraConfig, LoraDecoder, load_peft_adapter
from dew.objectives.lm import LMObjective
from dew.objectives.lora import LoraObjective, base_digest
from dew.objectives.rl import DPOObjective, GRPOObjective
from dew.rollouts.sampled import SampledRollout
from dew.sampling import Sampling
from dew.testing import tiny_decoder
from dew.trainer import checkpoint as ckpt

SEQ = 8
VOCAB = 16
LORA = LoraConfig(rank=2, alpha=4, targets=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, 32, init_std=0.5)


@pytest.fixture(scope="module")
def base(model):
    return model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))


def host(tree):
    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.array(jax.device_get(x), copy=True)

    return jax.tree.map(one, tree)


def repeat(batch, rows=4):
    def train(partition, start=0):
        for _ in itertools.count(start):
            yield dict(batch)

    return Dataset(train=train, val=None, records=None, batch=rows)


def lm_batch(seed=0, rows=4):
    rng = np.random.default_rng(seed)
    return {"text": rng.integers(1, VOCAB, size=(rows, SEQ + 1)).astype(np.int32)}


def assert_only_adapter_moved(state, base, objective):
    assert set(state.params) == {"params", "base"}
    for a, b in zip(jax.tree.leaves(host(state.params["base"])), jax.tree.leaves(host(base))):
        np.testing.assert_array_equal(a, b)
    adapter_size = optax.tree.size(state.params["params"])
    # adam's two moments for the adapter plus its step count: nothing for the base
    assert optax.tree.size(state.opt_state) == 2 * adapter_size + 1
    assert any(np.abs(b).max() > 0 for b in jax.tree.leaves(host(state.params["params"])))


def test_lm_lowers_its_loss_and_only_the_adapter_changes(model, base):
    objective = LoraObjective(LMObjective(model, SEQ, pretrained=base), LORA)
    batch = lm_batch()
    start = objective.init(jax.random.key(3))
    before = float(objective.loss(start, batch, jax.random.key(0))[0])
    plain = LMObjective(model, SEQ).loss(base, batch, jax.random.key(0))[0]
    assert before == pytest.approx(float(plain), rel=1e-6)  # b = 0: the base's own loss
    state = Trainer(objective, optax.adam(3e-2), key=jax.random.key(1)).fit(repeat(batch), 8)
    after = float(objective.loss(state.params, batch, jax.random.key(0))[0])
    assert after < before - 0.1
    assert state.ema is None
    assert_only_adapter_moved(state, base["params"], objective)


def dpo_pairs():
    rows = [
        {"chosen": [1, 2, 3, 5], "rejected": [1, 2, 4, 4, 5], "chosen_mask": [0, 0, 1, 1],
         "rejected_mask": [0, 0, 1, 1, 1]},
        {"chosen": [6, 1, 3, 5], "rejected": [6, 1, 4, 5]},
    ]  # fmt: skip
    pairs = PreferencePairs(records=tuple(json.dumps(r) for r in rows), seq_len=SEQ)
    return {k: np.asarray(v) for k, v in pairs.arrays.items()}


def test_dpo_uses_the_adapter_off_base_as_its_reference(model, base):
    objective = LoraObjective(DPOObjective(model, seq_len=SEQ - 1, beta=0.5, pretrained=base), LORA)
    batch = dpo_pairs()
    trainer = Trainer(objective, optax.adam(3e-2), key=jax.random.key(2))
    first = trainer.initial_state()
    assert first.ema == {}  # no second copy of the weights
    loss, weight, _ = objective.loss(first.params, batch, jax.random.key(0), first.ema)
    assert float(loss) / float(weight) == pytest.approx(np.log(2.0), rel=1e-6)
    state = trainer.fit(repeat(batch, 2), 6, state=first)
    loss, weight, metrics = objective.loss(state.params, batch, jax.random.key(0), state.ema)
    assert float(loss) / float(weight) < np.log(2.0) - 0.05
    assert float(metrics["rewards/accuracy"]) == 1.0
    assert_only_adapter_moved(state, base["params"], objective)


def prompts():
    prompt = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    return {
        "prompt": prompt,
        "prompt_length": np.array([2, 3], np.int32),
        "data_source": encode_text(["toy", "toy"], "data_source"),
        "ground_truth": encode_text(["", ""], "ground_truth"),
        "extra_info": encode_text(["", ""], "extra_info"),
    }


def test_grpo_samples_through_the_adapter_and_raises_the_reward(model, base):
    inner = GRPOObjective(model, seq_len=3 + 4 - 1, beta=0.05, pretrained=base)
    objective = LoraObjective(inner, LORA)
    assert isinstance(objective.model, LoraDecoder)

    def reward(data_source, completion, ground_truth, extra_info):
        return float(completion.split().count("7"))  # more 7s is better

    rollout = SampledRollout(objective, reward, groups=4, max_new_tokens=4,
                             sampling=Sampling(temperature=1.0))  # fmt: skip
    trainer = Trainer(objective, optax.adam(1e-1), key=jax.random.key(4), rollout=rollout)
    state = trainer.initial_state()
    assert state.ema == {}

    def seven(variables):
        logits = objective.model.apply(variables, jnp.asarray(prompts()["prompt"]))
        return float(jax.nn.log_softmax(logits[:, -1])[:, 7].mean())

    before = seven(state.params)
    np.testing.assert_allclose(before, seven({"base": state.params["base"]}), rtol=1e-6)
    state = trainer.fit(repeat(prompts(), 2), 10, state=state)
    assert seven(state.params) > before + 0.2
    assert_only_adapter_moved(state, base["params"], objective)


def test_resume_is_bit_identical_and_leaves_the_base_out(model, base, tmp_path):
    lora = LoraConfig(rank=2, alpha=4, targets=("q_proj", "v_proj", "down_proj"), dropout=0.1)

    def trainer(pretrained=base, **kwargs):
        objective = LoraObjective(LMObjective(model, SEQ, pretrained=pretrained), lora,
                                  base_path="bases/tiny")  # fmt: skip
        return Trainer(objective, optax.adamw(1e-2), key=jax.random.key(5), **kwargs)

    def data():
        def train(partition, start=0):
            for i in itertools.count(start):
                yield lm_batch(i)

        return Dataset(train=train, val=None, records=None, batch=4)

    full = trainer().fit(data(), steps=5)
    run = tmp_path / "run"
    trainer(checkpoint_every=2).fit(data(), steps=3, run_dir=run)
    resumed = trainer(checkpoint_every=2).fit(data(), steps=5, run_dir=run)
    for a, b in zip(jax.tree.leaves(host(full)), jax.tree.leaves(host(resumed)), strict=True):
        np.testing.assert_array_equal(a, b)
    meta = json.load(open(run / "checkpoints" / "step_00000005" / "meta.json"))
    saved = len(jax.tree.leaves(resumed)) - len(jax.tree.leaves(base["params"]))
    assert meta["leaves"] == saved  # the adapter, its optimizer state, counters and key
    assert meta["extra"]["frozen"] == {"base": "bases/tiny", "sha256": base_digest(base["params"])}
    other = model.init(jax.random.key(9), jnp.zeros((1, SEQ), jnp.int32))
    with pytest.raises(ValueError, match=r"trained against frozen weights .*bases/tiny.*same base"):
        trainer(other, checkpoint_every=2).fit(data(), steps=6, run_dir=run)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [3, 4, 5]  # the refusal wrote none


def test_export_round_trips_and_merged_weights_match(model, base, tmp_path):
    objective = LoraObjective(LMObjective(model, SEQ, pretrained=base), LORA,
                              base_path="bases/tiny")  # fmt: skip
    variables = objective.init(jax.random.key(3))
    noise = jax.tree.map(lambda b: 0.1 * jnp.ones_like(b), variables["params"])
    variables = {**variables, "params": noise}
    objective.save_adapter(tmp_path / "adapter", variables)
    loaded, lora = load_peft_adapter(tmp_path / "adapter", model.config)
    assert lora == LORA
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(noise), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    config = json.load(open(tmp_path / "adapter" / "adapter_config.json"))
    assert config["base_model_name_or_path"] == "bases/tiny"
    ids = jnp.asarray(lm_batch()["text"])
    merged = model.apply(objective.merged(variables), ids)
    np.testing.assert_allclose(merged, objective.model.apply(variables, ids), atol=2e-5)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda m, b: LMObjective(m, SEQ, pretrained=b, ema_decay=0.99), "ema_decay"),
        (lambda m, b: LoraObjective(LMObjective(m, SEQ, pretrained=b), LORA), "already"),
        (lambda m, b: type("NoModel", (), {"model": None, "ema_decay": None})(), "model"),
    ],
)
def test_refusals(model, base, make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LoraObjective(make(model, base), LORA)
    with pytest.raises(ValueError, match="targets"):
        LoraObjective(LMObjective(model, SEQ), LoraConfig(rank=2, alpha=4, targets=("nope",)))
    with pytest.raises(ValueError, match="'base' collection"):
        objective = LoraObjective(LMObjective(model, SEQ), LORA)
        objective.model.apply({"params": {}}, jnp.zeros((1, 2), jnp.int32))

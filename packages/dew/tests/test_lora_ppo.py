"""PPO with a LoRA adapter (``LoraPPOObjective``, built by ``build_stage("ppo", ...,
adapter=...)``): after a few Trainer steps the base is bit-identical, the policy's adapter and
the whole critic moved, and adam's moments exist for the adapter and the critic only; the KL
reference is the adapter-off base, the checkpoint leaves the base out and resumes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer, models
from dew.data.prompts import Prompts
from dew.models.lora import BASE, LoraDecoder
from dew.objectives.lora_ppo import LoraPPOObjective
from dew.recipes.lora_config import LoraSection, adapter_wrapper
from dew.recipes.stages import build_stage
from dew.trainer import checkpoint as ckpt

PROMPTS = [{"prompt": [1, 2, 3], "ground_truth": "a"}, {"prompt": [4, 5], "ground_truth": "b"}]
NEW = 4
WIDTH = 4 + NEW  # max_prompt_len + max_new_tokens


def low_half(data_source, completion, ground_truth, extra_info):
    """Share of completion ids below 16 (varies across samples, so advantages are nonzero)."""
    ids = [int(t) for t in completion.split()]
    return sum(i < 16 for i in ids) / max(len(ids), 1)


def host(tree):
    return jax.tree.map(lambda x: np.array(jax.device_get(x), copy=True), tree)


@pytest.fixture(scope="module")
def model():
    return models.build("causal_transformer", vocab_size=32, emb_features=16, num_layers=1,
                        num_heads=2, mlp_features=32, max_seq_len=16)  # fmt: skip


@pytest.fixture(scope="module")
def base(model):
    return host(model.init(jax.random.key(3), jnp.zeros((1, WIDTH), jnp.int32)))


def build(model, base, **options):
    lora = LoraSection(rank=2, alpha=4, targets=("q_proj", "v_proj"))
    wrap = adapter_wrapper(lora, model, "the-base")
    return build_stage("ppo", model, WIDTH, {"groups": 2, "max_new_tokens": NEW, **options},
                       pretrained=base, reward=low_half, adapter=wrap)  # fmt: skip


def data():
    return Prompts(records=tuple(json.dumps(p) for p in PROMPTS), max_prompt_len=4).load(2)


@pytest.fixture(scope="module")
def trained(model, base, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora-ppo") / "run"
    objective, rollout = build(model, base, beta=0.1)
    trainer = Trainer(objective, optax.adam(3e-2), key=jax.random.key(0), rollout=rollout,
                      progress=False)  # fmt: skip
    start = host(trainer.initial_state().params)
    state = trainer.fit(data(), steps=3, run_dir=run_dir)
    return objective, start, host(state.params), state, run_dir


def test_the_stage_wraps_ppo_and_samples_through_the_adapter(model, base):
    objective, rollout = build(model, base)
    assert isinstance(objective, LoraPPOObjective)
    assert isinstance(objective.model, LoraDecoder)
    assert not isinstance(objective.critic.backbone, LoraDecoder)  # the critic is plain
    assert isinstance(rollout.episodes.objective.model, LoraDecoder)  # the sampler
    assert objective.pretrained == {BASE: base["params"]}


def test_base_frozen_adapter_and_critic_trained_optimizer_state_for_both(trained, base):
    objective, start, params, state, _ = trained
    assert set(params) == {"params", BASE}
    assert set(params["params"]) == {"policy", "critic"} and set(params[BASE]) == {"policy"}
    for a, b in zip(jax.tree.leaves(params[BASE]["policy"]), jax.tree.leaves(base["params"])):
        np.testing.assert_array_equal(a, b)  # bit-identical
    adapter, critic = params["params"]["policy"], params["params"]["critic"]
    assert any(np.abs(b).max() > 0 for b in _leaves_named(adapter, "b"))  # b starts at zero
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(critic),
                                                      jax.tree.leaves(start["params"]["critic"]))]  # fmt: skip
    assert all(moved), moved  # every critic leaf, decoder and value head, trained
    sizes = optax.tree.size(adapter) + optax.tree.size(critic)
    assert optax.tree.size(state.opt_state) == 2 * sizes + 1  # adam's moments and its count
    assert state.ema == {}  # the reference is the adapter-off base, not a second copy


def test_reference_is_the_adapter_off_base(trained, model, base):
    objective, _, params, _, _ = trained
    ids = jnp.asarray([[1, 2, 3, 4, 5, 6, 7, 8]], jnp.int32)
    off = objective.model.apply(objective.reference_of(params), ids)
    np.testing.assert_array_equal(np.asarray(off), np.asarray(model.apply(base, ids)))
    on = objective.model.apply(objective.policy_variables(params), ids)
    assert np.abs(np.asarray(on) - np.asarray(off)).max() > 1e-6
    merged = objective.merged(params)
    assert set(merged) == {"params"}
    np.testing.assert_allclose(np.asarray(model.apply(merged, ids)), np.asarray(on), atol=1e-4)


def test_checkpoint_leaves_the_base_out_and_resumes(trained, model, base):
    objective, _, params, _, run_dir = trained
    (_, newest), *_ = ckpt.list_checkpoints(run_dir)[::-1]
    meta = json.load(open(f"{newest}/meta.json"))
    assert meta["extra"]["frozen"]["base"] == "the-base"
    n_base = len(jax.tree.leaves(base))
    n_train = len(jax.tree.leaves(params["params"]))
    assert len(meta["shapes"]) < 3 * n_train + n_base  # the base is not in the checkpoint
    again, rollout = build(model, base, beta=0.1)
    trainer = Trainer(again, optax.adam(3e-2), key=jax.random.key(0), rollout=rollout,
                      progress=False)  # fmt: skip
    restored = host(trainer.fit(data(), steps=3, run_dir=run_dir).params)  # finished: restores
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def _leaves_named(tree, name):
    out = []
    for key, value in tree.items():
        if key == name:
            out.append(value)
        elif isinstance(value, dict):
            out.extend(_leaves_named(value, name))
    return out


def test_a_chain_hands_on_the_merged_policy_without_the_critic(trained, model, base, tmp_path):
    from dew.recipes.chain_lora import hand_off

    objective, _, params, state, _ = trained
    start = hand_off(objective, state, tmp_path / "ppo", model)
    assert set(start) == {"params"}  # the policy alone: no critic, no base collection
    assert (tmp_path / "ppo" / "adapter" / "adapter_config.json").is_file()
    flat_base, flat_start = _flat(base["params"]), _flat(start["params"])
    assert flat_base.keys() == flat_start.keys()
    moved = {p for p in flat_base if not np.array_equal(flat_base[p], flat_start[p])}
    assert moved and all(p[-2] in ("q_proj", "v_proj") for p in moved), moved
    ids = jnp.asarray([[1, 2, 3, 4, 5, 6, 7, 8]], jnp.int32)
    on = objective.model.apply(objective.policy_variables(params), ids)
    np.testing.assert_allclose(np.asarray(model.apply(start, ids)), np.asarray(on), atol=1e-4)


def _flat(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = np.asarray(value)
    return out

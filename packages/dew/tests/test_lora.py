"""dew.models.lora on a tiny decoder: initialisation, targets, errors, gradients, dropout,
merging, generation methods and PEFT-file refusals (parity with PEFT: test_lora_peft.py)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models import build
from dew.models.lora import (
    PROJECTIONS,
    LoraConfig,
    adapter_value_and_grad,
    apply_adapters,
    check_adapters,
    init_adapters,
    load_peft_adapter,
    merge_adapters,
    save_peft_adapter,
    select_targets,
)
from dew.models.serving import fuse

SHAPE = dict(vocab_size=24, emb_features=16, num_layers=2, num_heads=4, num_kv_heads=2,
             mlp_features=20, max_seq_len=16)  # fmt: skip
IDS = jnp.array([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]], jnp.int32)
ALL = LoraConfig(rank=4, alpha=8, targets=PROJECTIONS)


@pytest.fixture(scope="module")
def base():
    model = build("llama", **SHAPE, tie_embeddings=False)
    return model, model.init(jax.random.key(0), IDS)


def noisy(adapters, seed=1, scale=0.3):
    """The same tree with every factor random (b no longer zero)."""
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )


def test_fresh_adapter_leaves_logits_unchanged(base):
    model, variables = base
    adapters = init_adapters(jax.random.key(3), model.config, ALL)
    got = apply_adapters(model, variables, adapters, ALL, IDS)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(model.apply(variables, IDS)))


def test_init_follows_peft(base):
    model, _ = base
    adapters = init_adapters(jax.random.key(3), model.config, ALL)
    q = adapters["layers_1"]["self_attn"]["q_proj"]
    down = adapters["layers_0"]["mlp"]["down_proj"]
    assert q["a"].shape == (16, 4) and q["b"].shape == (4, 16)
    assert down["a"].shape == (20, 4) and down["b"].shape == (4, 16)
    assert not np.any(np.asarray(q["b"]))
    # Kaiming-uniform with a = sqrt(5): uniform within +-1/sqrt(fan_in)
    for factor, fan_in in ((q["a"], 16), (down["a"], 20)):
        a = np.abs(np.asarray(factor))
        assert a.max() <= 1 / math.sqrt(fan_in) and a.max() > 0.5 / math.sqrt(fan_in)
    assert len(jax.tree.leaves(adapters)) == 2 * 7 * 2


def test_scale_and_rslora():
    assert LoraConfig(rank=4, alpha=8).scale == 2.0
    assert LoraConfig(rank=4, alpha=8, rslora=True).scale == 4.0


def test_target_rules(base):
    model, _ = base
    names = [t.name for t in select_targets(model.config, LoraConfig(4, 8, ("q_proj", "v_proj")))]
    assert names == [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qv"]
    regex = LoraConfig(4, 8, r".*\.(q_proj|v_proj)")
    assert [t.name for t in select_targets(model.config, regex)] == names
    one = select_targets(model.config, LoraConfig(4, 8, ("layers.1.mlp.up_proj",)))
    assert [(t.name, t.path) for t in one] == [
        ("model.layers.1.mlp.up_proj", ("layers_1", "mlp", "up_proj"))
    ]


@pytest.mark.parametrize(
    ("build_config", "message"),
    [
        (lambda: LoraConfig(rank=0, alpha=8), "rank: expected an int >= 1, got 0"),
        (lambda: LoraConfig(rank=True, alpha=8), "rank: expected an int >= 1, got True"),
        (lambda: LoraConfig(rank=2, alpha=0), "alpha: expected a number > 0, got 0"),
        (lambda: LoraConfig(rank=2, alpha=2, dropout=1.0), "dropout: expected a probability"),
        (lambda: LoraConfig(rank=2, alpha=2, targets=()), "targets: expected non-empty"),
    ],
)
def test_config_errors(build_config, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        build_config()


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        (LoraConfig(4, 8, ("q_prj",)), "targets: 'q_prj' matches no projection"),
        (LoraConfig(4, 8, ("lm_head",)), "targets: 'lm_head' matches no projection"),
        (LoraConfig(4, 8, "q_proj"), "targets: pattern 'q_proj' matches no projection"),
        (LoraConfig(17, 8, ("q_proj",)), r"rank: expected at most 16 for model.layers.0"),
        (LoraConfig(17, 8, ("down_proj",)), r"rank: expected at most 16 .*\[20, 16\]\), got 17"),
    ],
)
def test_target_errors(base, lora, message):
    model, _ = base
    with pytest.raises(ValueError, match=message):
        init_adapters(jax.random.key(0), model.config, lora)


def test_adapter_for_another_base_is_refused(base):
    model, variables = base
    wider = build("llama", **{**SHAPE, "emb_features": 32}, tie_embeddings=False)
    adapters = init_adapters(jax.random.key(0), wider.config, ALL)
    with pytest.raises(ValueError, match=r"adapters: layers_0/self_attn/q_proj/a: expected "
                       r"shape \(16, 4\), got \(32, 4\)"):  # fmt: skip
        apply_adapters(model, variables, adapters, ALL, IDS)
    ours = init_adapters(jax.random.key(0), model.config, ALL)
    with pytest.raises(ValueError, match="expected shape"):
        check_adapters(ours, model.config, LoraConfig(2, 8, PROJECTIONS))
    fewer = LoraConfig(4, 8, ("q_proj",))
    with pytest.raises(ValueError, match="adapters: unexpected factor layers_0/mlp/down_proj/a"):
        check_adapters(ours, model.config, fewer)
    with pytest.raises(
        ValueError, match="adapters: expected a factor at layers_0/self_attn/k_proj/a, got none"
    ):
        check_adapters(init_adapters(jax.random.key(0), model.config, fewer), model.config, ALL)


def test_only_the_adapters_receive_gradients(base):
    model, variables = base
    adapters = noisy(init_adapters(jax.random.key(0), model.config, ALL))

    def loss(params, adapters):
        return jnp.mean(apply_adapters(model, {"params": params}, adapters, ALL, IDS) ** 2)

    step = adapter_value_and_grad(loss)
    update = jax.jit(step)
    value, grads = update(variables["params"], adapters)
    assert jax.tree.structure(grads) == jax.tree.structure(adapters)
    assert all(np.any(np.asarray(g)) for g in jax.tree.leaves(grads))
    # the base sits behind stop_gradient: differentiating through the wrapper gives it nothing
    base_grads = jax.jit(jax.grad(lambda p: step(p, adapters)[0]))(variables["params"])
    assert not any(np.any(np.asarray(g)) for g in jax.tree.leaves(base_grads))
    # a few plain SGD steps on the adapters alone lower the loss; the base is untouched
    for _ in range(3):
        _, grads = update(variables["params"], adapters)
        adapters = jax.tree.map(lambda a, g: a - 0.5 * g, adapters, grads)
    assert float(update(variables["params"], adapters)[0]) < float(value)


def test_dropout_only_with_a_key(base):
    model, variables = base
    lora = LoraConfig(4, 8, PROJECTIONS, dropout=0.5)
    adapters = noisy(init_adapters(jax.random.key(0), model.config, lora))
    plain = apply_adapters(model, variables, adapters, lora, IDS)
    again = apply_adapters(model, variables, adapters, lora, IDS)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(again))
    dropped = apply_adapters(model, variables, adapters, lora, IDS, dropout_key=jax.random.key(5))
    same_key = apply_adapters(model, variables, adapters, lora, IDS, dropout_key=jax.random.key(5))
    assert np.abs(np.asarray(dropped) - np.asarray(plain)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(dropped), np.asarray(same_key))
    fresh = init_adapters(jax.random.key(0), model.config, lora)  # b = 0: dropout cannot show
    still = apply_adapters(model, variables, fresh, lora, IDS, dropout_key=jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(still), np.asarray(model.apply(variables, IDS)))


def test_merge_equals_the_adapter_path_and_generation_methods(base):
    model, variables = base
    lora = LoraConfig(4, 6, ("q_proj", "o_proj", "up_proj"), rslora=True)
    adapters = noisy(init_adapters(jax.random.key(0), model.config, lora))
    logits = np.asarray(apply_adapters(model, variables, adapters, lora, IDS))
    merged = {"params": merge_adapters(variables["params"], adapters, model.config, lora)}
    np.testing.assert_allclose(np.asarray(model.apply(merged, IDS)), logits, atol=1e-5)
    assert merged["params"]["norm"]["scale"] is variables["params"]["norm"]["scale"]
    # the adapters apply through prefill as well (any method of the decoder)
    lengths = jnp.full((2,), IDS.shape[1], jnp.int32)
    last, _ = apply_adapters(model, variables, adapters, lora, IDS, lengths, 12, method="prefill")
    np.testing.assert_allclose(np.asarray(last), logits[:, -1], atol=1e-5)
    with pytest.raises(ValueError, match="variables: expected the training layout"):
        apply_adapters(model, fuse(variables, model.config), adapters, lora, IDS)


def test_peft_config_refusals(base, tmp_path):
    model, _ = base
    adapters = init_adapters(jax.random.key(0), model.config, ALL)
    folder = save_peft_adapter(tmp_path / "a", adapters, model.config, ALL)
    config_path = folder / "adapter_config.json"
    original = json.loads(config_path.read_text())
    for field, value, message in (
        ("use_dora", True, "adapter_config.json use_dora: expected false .* got true"),
        ("rank_pattern", {"q_proj": 2}, "adapter_config.json rank_pattern: expected {}"),
        ("peft_type", "IA3", "adapter_config.json peft_type: expected 'LORA', got 'IA3'"),
        ("r", 2, r"q_proj.lora_A.weight': expected shape \(2, 16\), got \(4, 16\)"),
        ("target_modules", ["q_proj"], "unexpected tensor 'base_model.model.model.layers.0.mlp"),
    ):
        config_path.write_text(json.dumps({**original, field: value}))
        with pytest.raises(ValueError, match=message):
            load_peft_adapter(folder, model.config)
    config_path.write_text(json.dumps({**original, "target_modules": "all-linear"}))
    loaded, lora = load_peft_adapter(folder, model.config)
    assert lora.targets == PROJECTIONS and len(jax.tree.leaves(loaded)) == 28

"""dew.recipes.builder: the model, optimizer and schedule from a config, and its errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.recipes.builder import (
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    build_model,
    build_optimizer,
    build_schedule,
    model_config,
    optimizer_config,
    schedule_config,
)
from dew.recipes.schema import ConfigError, apply_override, load_file, parse_value


def test_cosine_schedule_warms_up_then_decays_to_the_end_fraction():
    rate = build_schedule(ScheduleConfig("cosine", warmup_steps=4, end_fraction=0.1), 1e-2, 20)
    values = [float(rate(i)) for i in range(25)]
    assert values[0] == 0.0 and values[4] == pytest.approx(1e-2)
    assert values[2] == pytest.approx(5e-3)
    assert values[20] == pytest.approx(1e-3) and values[24] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(values[4:20], values[5:21]))


def test_constant_schedule_is_flat_after_warmup_and_linear_reaches_the_end():
    flat = build_schedule(ScheduleConfig("constant"), 3e-4, 10)
    assert [float(flat(i)) for i in (0, 5, 50)] == pytest.approx([3e-4] * 3)
    warm = build_schedule(ScheduleConfig("constant", warmup_steps=2), 1.0, 10)
    assert [float(warm(i)) for i in (0, 1, 2, 9)] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    line = build_schedule(ScheduleConfig("linear", end_fraction=0.0), 1.0, 10)
    assert [float(line(i)) for i in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])


def test_optimizer_matches_optax_and_exposes_the_learning_rate():
    config = OptimizerConfig("adamw", learning_rate=1e-2, weight_decay=0.1, clip=0.0)
    schedule = ScheduleConfig("cosine", warmup_steps=1)
    ours = build_optimizer(config, schedule, steps=5)
    ref = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 1, 5, 1e-3), weight_decay=0.1)
    params = {"w": jnp.arange(4.0)}
    grads = {"w": jnp.array([0.5, -1.0, 2.0, 0.0])}
    s1, s2 = ours.init(params), ref.init(params)
    for _ in range(3):
        u1, s1 = ours.update(grads, s1, params)
        u2, s2 = ref.update(grads, s2, params)
        # inject_hyperparams holds b1, b2 as float32 arrays: float32 rounding apart
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=2e-5)
    assert float(s1.hyperparams["learning_rate"]) == pytest.approx(
        float(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 1, 5, 1e-3)(2))
    )


def test_clip_limits_the_update_norm():
    opt = build_optimizer(OptimizerConfig("sgd", learning_rate=1.0, clip=1.0), steps=1)
    params = {"w": jnp.zeros(2)}
    update, _ = opt.update({"w": jnp.array([30.0, 40.0])}, opt.init(params), params)
    assert float(jnp.linalg.norm(update["w"])) == pytest.approx(1.0)


def test_build_model_fills_sizes_from_the_data():
    model, variables = build_model(
        model_config({"name": "llama", "emb_features": 16, "num_layers": 1, "num_heads": 2}),
        vocab_size=40,
        max_seq_len=9,
    )
    assert variables is None
    assert model.config.vocab_size == 40 and model.config.max_seq_len == 9
    assert model.config.mlp_features == 64
    out = model.apply(model.init(jax.random.key(0), jnp.zeros((1, 9), jnp.int32)),
                      jnp.zeros((1, 9), jnp.int32))  # fmt: skip
    assert out.shape == (1, 9, 40)


@pytest.mark.parametrize(
    ("maker", "mapping", "message"),
    [
        (
            optimizer_config,
            {"learning_rat": 1e-3},
            "optimizer.learning_rat: unknown key; did you mean 'learning_rate'?",
        ),
        (
            optimizer_config,
            {"learning_rate": -1e-3},
            "optimizer.learning_rate: expected a number > 0, got -0.001",
        ),
        (
            optimizer_config,
            {"learning_rate": "fast"},
            "optimizer.learning_rate: expected a number, got 'fast'",
        ),
        (
            optimizer_config,
            {"name": "adagrad"},
            "optimizer.name: expected one of adam, adamw, sgd, got 'adagrad'",
        ),
        (
            optimizer_config,
            {"name": "adam", "weight_decay": 0.1},
            "optimizer.weight_decay: only adamw decays weights",
        ),
        (optimizer_config, {"b2": 1.5}, "optimizer.b2: expected a number in [0, 1), got 1.5"),
        (
            schedule_config,
            {"kind": "cosin"},
            "schedule.kind: expected one of constant, cosine, linear, got 'cosin'",
        ),
        (
            schedule_config,
            {"warmup": 3},
            "schedule.warmup: unknown key; did you mean 'warmup_steps'?",
        ),
        (
            schedule_config,
            {"warmup_steps": -2},
            "schedule.warmup_steps: expected a number >= 0, got -2",
        ),
        (
            schedule_config,
            {"warmup_steps": 2.5},
            "schedule.warmup_steps: expected an integer, got 2.5",
        ),
        (
            model_config,
            {"num_layer": 2},
            "model.num_layer: unknown key; did you mean 'num_layers'?",
        ),
        (model_config, {"name": "gpt9"}, "model.name: expected one of"),
        (model_config, {"num_heads": 0}, "model.num_heads: expected a number > 0, got 0"),
        (
            model_config,
            {"dtype": "float8"},
            "model.dtype: expected one of float32, bfloat16, float16, got 'float8'",
        ),
        (model_config, ["qwen3"], "model: expected a mapping of keys, got ['qwen3']"),
    ],
)
def test_bad_sections_name_the_key(maker, mapping, message):
    with pytest.raises(ConfigError) as err:
        maker(mapping)
    assert message in str(err.value)


def test_schedule_with_more_warmup_than_steps_is_refused():
    with pytest.raises(ConfigError, match="schedule.warmup_steps: 10 leaves no steps to decay"):
        build_schedule(ScheduleConfig("cosine", warmup_steps=10), 1.0, 10)


def test_pretrained_missing_directory_is_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_model(ModelConfig(pretrained=str(tmp_path / "nowhere")), vocab_size=10)


def test_overrides_and_files(tmp_path):
    config = {"optimizer": {"name": "adam"}}
    apply_override(config, "optimizer.learning_rate=1e-5")
    apply_override(config, "schedule.kind=cosine")
    apply_override(config, "model.pretrained=null")
    assert config == {
        "optimizer": {"name": "adam", "learning_rate": 1e-5},
        "schedule": {"kind": "cosine"},
        "model": {"pretrained": None},
    }
    assert parse_value("true") is True and parse_value("3") == 3 and parse_value("a:b") == "a:b"
    with pytest.raises(ConfigError, match=r"--set 'optimizer': expected KEY.PATH=VALUE"):
        apply_override(config, "optimizer")
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("optimizer:\n  learning_rate: 1e-3\n  name: [adam\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line \d+: malformed YAML"):
        load_file(yaml_file)
    json_file = tmp_path / "c.json"
    json_file.write_text('{"a": 1,\n "b": }')
    with pytest.raises(ConfigError, match=r"c.json: line 2: malformed JSON"):
        load_file(json_file)
    with pytest.raises(ConfigError, match=r"missing.yaml: no such config file"):
        load_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not UTF-8 text \(byte 3\)"):
        load_file(bad)

"""LoRA parity with PEFT 0.21.2: logits, adapter gradients, and adapters saved either way.

Fixtures come from tools/parity_lora.py (peft, transformers 5.x, torch CPU): a tiny
Llama (untied head, all seven projections, r=4, alpha=8) and a tiny Qwen3 (tied,
q/k norm, a regex over q/v/down, r=3, alpha=6, rsLoRA), each with random non-zero
adapter factors. Nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models import Pretrained, load_pretrained, safetensors_io
from dew.models.lora import (
    adapter_value_and_grad,
    apply_adapters,
    load_peft_adapter,
    merge_adapters,
    save_peft_adapter,
    select_targets,
)
from dew.models.lora.peft_io import peft_names

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "lora"
CASES = ["llama", "qwen3"]
SIDECAR = json.loads((FIXTURES / "lora.json").read_text())


@pytest.fixture(scope="module", params=CASES)
def case(request):
    name = request.param
    pretrained = load_pretrained(FIXTURES / name / "base")
    adapters, lora = load_peft_adapter(FIXTURES / name / "adapter", pretrained.config)
    return name, pretrained, adapters, lora, np.load(FIXTURES / f"{name}.npz")


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=what)


def mean_next_token_nll(logits: jax.Array, ids: jax.Array) -> jax.Array:
    """The recorder's loss: mean cross-entropy of ids[:, 1:] under logits[:, :-1]."""
    log_probs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(log_probs, ids[:, 1:, None], axis=-1)[..., 0]
    return -jnp.mean(picked)


def test_logits_match_peft(case):
    name, pretrained, adapters, lora, recorded = case
    logits = np.asarray(
        apply_adapters(pretrained.model, pretrained.variables, adapters, lora, recorded["ids"])
    )
    _close(logits, recorded["logits"], name)
    # the adapter matters: the base alone scores the ids differently
    base = np.asarray(pretrained.model.apply(pretrained.variables, recorded["ids"]))
    _close(base, recorded["base_logits"], name)
    assert np.abs(recorded["logits"] - recorded["base_logits"]).max() > 0.05


def test_adapter_gradients_match_peft(case):
    name, pretrained, adapters, lora, recorded = case
    model, ids = pretrained.model, jnp.asarray(recorded["ids"])

    def loss(params, adapters):
        logits = apply_adapters(model, {"params": params}, adapters, lora, ids)
        return mean_next_token_nll(logits, ids)

    value, grads = jax.jit(adapter_value_and_grad(loss))(pretrained.variables["params"], adapters)
    np.testing.assert_allclose(float(value), float(recorded["loss"]), rtol=1e-5)
    recorded_keys = {k for k in recorded.files if k.startswith("grad:")}
    seen = set()
    for target in select_targets(pretrained.config, lora):
        node = grads
        for key in target.path:
            node = node[key]
        for factor, key in peft_names(target.name).items():
            want = recorded[f"grad:{key}"]
            scale = np.abs(want).max()
            got = np.asarray(node[factor]).T
            assert np.abs(got - want).max() <= 1e-4 * scale, (name, key)
            seen.add(f"grad:{key}")
    assert seen == recorded_keys


def test_exported_adapter_equals_peft_saved_files(case, tmp_path):
    name, pretrained, adapters, lora, _ = case
    out = save_peft_adapter(tmp_path / "adapter", adapters, pretrained.config, lora)
    ours = safetensors_io.load(out / "adapter_model.safetensors")
    theirs = safetensors_io.load(FIXTURES / name / "adapter" / "adapter_model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype == np.float32
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    mine = json.loads((out / "adapter_config.json").read_text())
    peft = json.loads((FIXTURES / name / "adapter" / "adapter_config.json").read_text())
    for field in ("peft_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "bias"):
        assert mine[field] == peft[field], field
    if isinstance(peft["target_modules"], str):
        assert mine["target_modules"] == peft["target_modules"]
    else:
        assert sorted(mine["target_modules"]) == sorted(peft["target_modules"])
    # and back: the export loads into the same tree
    again, lora_again = load_peft_adapter(out, pretrained.config)
    assert lora_again == lora
    assert jax.tree.all(jax.tree.map(np.array_equal, again, adapters))


def test_merged_weights_save_and_score_like_peft(case, tmp_path):
    name, pretrained, adapters, lora, recorded = case
    merged = merge_adapters(pretrained.variables["params"], adapters, pretrained.config, lora)
    saved = Pretrained.replace(pretrained, variables={"params": merged})
    reloaded = load_pretrained(saved.save(tmp_path / "merged", dtype="float32"))
    logits = np.asarray(reloaded.model.apply(reloaded.variables, recorded["ids"]))
    _close(logits, recorded["logits"], name)


@pytest.mark.parametrize("name", CASES)
def test_recorder_confirmed_peft_reads_dew_exports(name):
    """tools/parity_lora.py exported each PEFT-saved adapter again with Dew, loaded
    that copy in PEFT (and Dew's merged weights in transformers) and scored the ids."""
    entry = SIDECAR["cases"][name]
    assert SIDECAR["version"] == "0.21.2"
    assert entry["adapter_tensors_equal_peft_saved"] is True
    assert entry["adapter_files"] == ["adapter_config.json", "adapter_model.safetensors"]
    assert entry["dew_adapter_in_peft_max_abs_logit_diff"] == 0.0
    assert entry["dew_merged_in_transformers_max_abs_logit_diff"] <= 1e-5
    read, config = entry["peft_read_config"], entry["lora_config"]
    assert read["r"] == config["r"] and read["lora_alpha"] == config["lora_alpha"]
    assert read["use_rslora"] == config.get("use_rslora", False)
    targets = config["target_modules"]
    assert read["target_modules"] == (targets if isinstance(targets, str) else sorted(targets))

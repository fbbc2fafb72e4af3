"""Hugging Face checkpoints: parity with transformers' logits, save/load round trips, errors.

Fixtures come from tools/parity_hf_models.py (transformers 5.x, torch CPU); nothing
here imports torch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from dew.models import CheckpointError, Pretrained, build, load_pretrained, safetensors_io

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"
CASES = [
    "qwen3_tied",
    "qwen3_untied_sharded",
    "llama3_untied",
    "llama_linear_tied",
    "qwen2_tied",
    "mistral_sliding",
]


@pytest.fixture(scope="module", params=CASES)
def case(request):
    name = request.param
    return name, load_pretrained(FIXTURES / name), np.load(FIXTURES / f"{name}.npz")


def test_logits_match_transformers(case):
    name, pretrained, recorded = case
    logits = np.asarray(pretrained.model.apply(pretrained.variables, recorded["ids"]))
    reference = recorded["logits"]
    assert logits.dtype == np.float32 and logits.shape == reference.shape
    assert np.abs(logits - reference).max() <= 1e-4 * np.abs(reference).max(), name
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-5)


def test_config_read(case):
    name, pretrained, _ = case
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    cfg = pretrained.config
    assert cfg.tie_embeddings == hf["tie_word_embeddings"]
    assert cfg.rope_theta == hf["rope_parameters"]["rope_theta"]
    assert cfg.rope_scaling.rope_type == hf["rope_parameters"]["rope_type"]
    assert cfg.qk_norm == name.startswith("qwen3")
    assert cfg.sliding_window == (hf["sliding_window"] if name.startswith("mistral") else None)
    assert ("lm_head" in pretrained.variables["params"]) == (not cfg.tie_embeddings)


def test_save_load_bit_identical(case, tmp_path):
    name, pretrained, _ = case
    out = pretrained.save(tmp_path / "f32", dtype="float32")
    again = load_pretrained(out)
    for a, b in zip(jax.tree.leaves(pretrained.variables), jax.tree.leaves(again.variables)):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(pretrained.variables) == jax.tree.structure(again.variables)
    hf = json.loads((out / "config.json").read_text())
    original = json.loads((FIXTURES / name / "config.json").read_text())
    assert hf["architectures"] == original["architectures"]
    assert hf.get("sliding_window") == original.get("sliding_window")


def test_export_names_match_checkpoint(case):
    name, pretrained, _ = case
    directory = FIXTURES / name
    index = directory / "model.safetensors.index.json"
    if index.exists():
        names = set(json.loads(index.read_text())["weight_map"])
    else:
        names = set(safetensors_io.read_header(directory / "model.safetensors")[0])
    exported = dict(pretrained.export(dtype="float32"))
    assert set(exported) == names
    for key, array in exported.items():
        assert array.dtype == np.float32, key
    # bfloat16 export rounds the float32 weights
    first = next(iter(pretrained.export(dtype="bfloat16")))
    assert first[1].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(first[1], exported[first[0]].astype(ml_dtypes.bfloat16))


def test_sharded_bfloat16_save_replaces_previous(tmp_path):
    pretrained = load_pretrained(FIXTURES / "llama3_untied")
    target = tmp_path / "ckpt"
    pretrained.save(target, dtype="float32")
    pretrained.save(target, dtype="bfloat16", max_shard_bytes=60_000)
    files = sorted(p.name for p in target.iterdir())
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    assert not [f for f in files if f.startswith(".")]
    again = load_pretrained(target)
    for a, b in zip(jax.tree.leaves(pretrained.variables), jax.tree.leaves(again.variables)):
        np.testing.assert_array_equal(
            np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32), b
        )
    assert json.loads((target / "config.json").read_text())["dtype"] == "bfloat16"


def test_built_model_saves_and_loads(tmp_path):
    model = build(
        "qwen3",
        vocab_size=40,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        mlp_features=24,
        rope_theta=777.0,
    )
    ids = np.array([[1, 2, 3]], np.int32)
    variables = model.init(jax.random.key(3), ids)
    saved = Pretrained.from_model(model, variables).save(tmp_path / "m", dtype="float32")
    loaded = load_pretrained(saved)
    assert loaded.family == "qwen3" and loaded.config.rope_theta == 777.0
    np.testing.assert_array_equal(
        model.apply(variables, ids), loaded.model.apply(loaded.variables, ids)
    )


def _copy(tmp_path: Path, name: str = "qwen3_tied") -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    return target


def _rewrite(directory: Path, change) -> None:
    path = directory / "model.safetensors"
    tensors = safetensors_io.load(path)
    change(tensors)
    safetensors_io.save(tensors, path)


def test_missing_tensor_is_named(tmp_path):
    directory = _copy(tmp_path)
    _rewrite(directory, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing"):
        load_pretrained(directory)


def test_shape_mismatch_is_named(tmp_path):
    directory = _copy(tmp_path)

    def shrink(t):
        t["model.norm.weight"] = t["model.norm.weight"][:-1]

    _rewrite(directory, shrink)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*shape \(63,\)"):
        load_pretrained(directory)


def test_integer_dtype_is_named(tmp_path):
    directory = _copy(tmp_path)

    def to_int(t):
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.int32)

    _rewrite(directory, to_int)
    with pytest.raises(CheckpointError, match=r"q_norm\.weight.*dtype I32"):
        load_pretrained(directory)


def test_tied_head_must_equal_embedding(tmp_path):
    directory = _copy(tmp_path)

    def add_head(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1

    _rewrite(directory, add_head)
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_pretrained(directory)


def test_unknown_architecture_and_layouts(tmp_path):
    directory = _copy(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    config["model_type"] = "gpt_neox"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        load_pretrained(directory)
    config.update(architectures=["Qwen3ForCausalLM"], hidden_act="gelu")
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act"):
        load_pretrained(directory)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(dict(config, hidden_act="silu")))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(empty)
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\.bin"):
        load_pretrained(empty)


def test_recorder_confirmed_transformers_reads_dew_saves(case):
    """tools/parity_hf_models.py saved each case with Pretrained.save, loaded that copy in
    transformers and stored the logits transformers computed from it (dew_saves.npz).
    They must be the logits Dew computes from the same parameters: a save with a wrong
    name, transpose, tie or config field would make transformers compute others."""
    name, pretrained, recorded = case
    sidecar = json.loads((FIXTURES / "models.json").read_text())
    assert sidecar["package"] == "transformers" and sidecar["version"].startswith("5.")
    assert set(sidecar["cases"]) == set(CASES)
    with np.load(FIXTURES / "dew_saves.npz") as saves:
        assert set(saves.files) == set(CASES)
        from_dew_save = saves[name]
    ours = np.asarray(pretrained.model.apply(pretrained.variables, recorded["ids"]))
    assert from_dew_save.shape == ours.shape
    np.testing.assert_allclose(from_dew_save, ours, rtol=1e-4, atol=1e-5, err_msg=name)
    assert np.abs(from_dew_save - ours).max() <= 1e-4 * np.abs(ours).max(), name
    files = sidecar["cases"][name]["dew_save_reloaded_in_transformers"]["files"]
    assert ("model.safetensors.index.json" in files) == name.endswith("sharded"), files

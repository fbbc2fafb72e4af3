"""``scan_layers`` from the command line and the config to the model (``--scan-layers``,
``model.scan_layers``): a resume may change it and a saved checkpoint does not hold it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew import models

SMALL = dict(vocab_size=64, emb_features=32, num_layers=2, num_heads=4, num_kv_heads=2,
             mlp_features=64, max_seq_len=32, qk_norm=True)  # fmt: skip


def test_the_flag_and_config_key_reach_the_model(tmp_path) -> None:
    from dew.cli import build_parser, train_mapping
    from dew.recipes.builder import build_model
    from dew.recipes.schema import ConfigError
    from dew.recipes.train_config import train_config

    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.uint16))
    base = ["train", "lm", "--tokens", str(tmp_path / "t.npy"), "--run-dir", str(tmp_path / "r"),
            "--steps", "1"]  # fmt: skip
    config = train_config(train_mapping(build_parser().parse_args(base)), "lm")
    assert config.model.scan_layers is False
    args = build_parser().parse_args(base + ["--scan-layers", "--remat", "full"])
    config = train_config(train_mapping(args), "lm")
    model, _ = build_model(config.model, vocab_size=16, max_seq_len=8)
    assert model.config.scan_layers is True and model.config.remat == "full"
    args = build_parser().parse_args(base + ["--set", "model.scan_layers=maybe"])
    with pytest.raises(ConfigError, match=r"^model.scan_layers: expected true or false"):
        train_config(train_mapping(args), "lm")


def test_a_resume_may_change_it_and_checkpoints_leave_it_out(tmp_path) -> None:
    from dew.recipes.train import _MAY_CHANGE, _SAME, check_same_run

    (tmp_path / "run" / "checkpoints" / "step_00000001").mkdir(parents=True)
    old = {"kind": "lm", "model": {"name": "qwen3", "scan_layers": False}}
    (tmp_path / "run" / "config.json").write_text(json.dumps(old))
    new = {**old, "model": {"name": "qwen3", "scan_layers": True}}
    check_same_run(str(tmp_path / "run"), new, _SAME, _MAY_CHANGE)
    params = models.build("qwen3", **SMALL).init(jax.random.key(1), np.zeros((1, 4), np.int32))
    for scan, folder in ((False, "plain"), (True, "scan")):
        model = models.build("qwen3", scan_layers=scan, **SMALL)
        models.Pretrained.from_model(model, params).save(tmp_path / folder)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "scan" / name).read_bytes()
    assert "scan_layers" not in (tmp_path / "scan" / "config.json").read_text()

"""`dew chain`: a stage of tool episodes (dew-sandbox's environment source) refuses a LoRA
adapter in one line, before anything is written. Here, not in dew's own tests, because the
source kind is registered by dew-sandbox."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp

from dew import models
from dew.cli import main
from dew.data.tokens import write_tokens


def test_an_adapter_on_tool_episodes_is_refused_from_a_config(tmp_path, capsys) -> None:
    model = models.build("causal_transformer", vocab_size=32, emb_features=16, num_layers=1,
                         num_heads=2, mlp_features=32, max_seq_len=32)  # fmt: skip
    variables = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    models.Pretrained.from_model(model, variables).save(tmp_path / "base", dtype="float32")
    write_tokens(tmp_path / "tokens.bin", jnp.arange(64, dtype=jnp.uint16) % 8, "uint16")
    source = {"kind": "environment", "command": [sys.executable, "-c", "pass"], "tasks": 4}
    stages = [
        {"name": "lm", "steps": 1, "data": {"type": "TokenFile", "path": "tokens.bin", "seq_len": 7}},
        {"name": "tools", "steps": 1, "eos_id": 1, "max_new_tokens": 4, "source": source},
    ]  # fmt: skip
    config = {"output": "out", "batch": 2, "seed": 0, "model": {"pretrained": "base"},
              "lora": {"rank": 2, "alpha": 4, "targets": ["q_proj"]},
              "optimizer": {"name": "adam", "learning_rate": 1e-2}, "stages": stages}  # fmt: skip
    (tmp_path / "chain.json").write_text(json.dumps(config))
    assert main(["chain", str(tmp_path / "chain.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = "stages.1: Stage.lora (tools): expected prompts from data (adapters are not served"
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()

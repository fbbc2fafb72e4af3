"""``dew train ppo`` on tool episodes (dew-sandbox's environment source) refuses a LoRA
adapter in one line naming ``lora``, before anything is written. Here, not in dew's own
tests, because the source kind is registered by dew-sandbox."""

from __future__ import annotations

import json
import sys

from dew.cli import main


def test_ppo_on_tool_episodes_refuses_the_lora_flags(tmp_path, capsys) -> None:
    run_dir = tmp_path / "ppo"
    config = {
        "run": {"run_dir": str(run_dir), "steps": 1, "batch": 2, "progress": False},
        "model": {"name": "causal_transformer", "vocab_size": 8, "emb_features": 16,
                  "num_layers": 1, "num_heads": 2, "mlp_features": 32},
        "objective": {"groups": 2, "max_new_tokens": 4, "eos_id": 1},
        "source": {"kind": "environment", "command": [sys.executable, "-c", "pass"],
                   "tasks": 4},
    }  # fmt: skip
    path = tmp_path / "ppo.json"
    path.write_text(json.dumps(config))
    assert main(["train", "ppo", "--config", str(path), "--lora-rank", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = ("dew: error: lora: expected prompts from data (adapters are not served to tool "
                "workers yet), got a source section")  # fmt: skip
    assert err == [expected], err
    assert not run_dir.exists()

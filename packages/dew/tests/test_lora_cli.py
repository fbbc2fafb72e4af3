"""``dew train`` with a LoRA adapter: the flags and the ``lora`` section, the adapter written
in PEFT's layout with merged weights in ``--export``, and one-line errors naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dew.cli import main
from dew.models.lora import load_peft_adapter
from dew.models.pretrained import load_pretrained
from dew.trainer import checkpoint as ckpt

TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "4", "--log-every", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    base = tmp_path_factory.mktemp("lora-cli")
    np.arange(1, 200, dtype=np.uint16).tofile(base / "tokens.bin")
    return base


def lm(base, run_dir, *extra):
    return ["train", "lm", "--tokens", str(base / "tokens.bin"), "--run-dir", str(run_dir),
            "--steps", "2", "--seq-len", "8", *TINY, *extra]  # fmt: skip


def test_train_lm_with_lora_flags_writes_the_adapter_and_merged_weights(tokens, tmp_path, capsys):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    code = main(lm(tokens, run_dir, "--lora-rank", "2", "--lora-alpha", "4", "--lora-targets",
                   "q_proj,down_proj", "--lr", "1e-2", "--export", str(out),
                   "--export-dtype", "float32"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    config = json.load(open(run_dir / "config.json"))
    assert config["lora"] == {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "down_proj"],
                              "dropout": 0.0, "rslora": False}  # fmt: skip
    loaded = load_pretrained(str(out))
    adapters, lora = load_peft_adapter(run_dir / "adapter", loaded.config)
    assert lora.rank == 2 and lora.targets == ("q_proj", "down_proj")
    assert any(np.abs(np.asarray(b)).max() > 0 for b in _factors(adapters, "b"))
    ((_, newest),) = ckpt.list_checkpoints(run_dir)[-1:]
    meta = json.load(open(f"{newest}/meta.json"))
    assert set(meta["extra"]["frozen"]) == {"base", "sha256"}
    again = lm(tokens, run_dir, "--lora-rank", "4", "--lora-alpha", "4", "--lora-targets",
               "q_proj,down_proj", "--steps", "3")  # fmt: skip
    line = error_line(capsys, again)
    assert "holds a run started with other settings (lora.rank 2 -> 4)" in line, line


def _factors(tree, name):
    out = []
    for key, value in tree.items():
        if key == name:
            out.append(value)
        elif isinstance(value, dict):
            out.extend(_factors(value, name))
    return out


def error_line(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora-rank", "0"], "dew: error: lora.rank: expected an int >= 1, got 0"),
        (["--lora-rank", "2", "--lora-alpha", "-1"],
         "dew: error: lora.alpha: expected a number > 0, got -1.0"),
        (["--lora-rank", "2", "--lora-targets", "qproj"],
         "dew: error: lora.targets: 'qproj' matches no projection"),
        (["--lora-rank", "2", "--lora-targets", ".*nope"],
         "dew: error: lora.targets: pattern '.*nope' matches no projection"),
        (["--lora-rank", "64"], "dew: error: lora.rank: expected at most 16 for"),
        (["--set", "lora.rnak=2"], "dew: error: lora.rnak: unknown key; did you mean 'rank'?"),
        (["--set", "lora.dropout=1.5"],
         "dew: error: lora.dropout: expected a probability in [0, 1), got 1.5"),
        (["--set", "lora.rslora=3"], "dew: error: lora.rslora: expected true or false, got 3"),
    ],
)  # fmt: skip
def test_bad_lora_values_are_one_line_naming_the_key(tokens, tmp_path, capsys, extra, message):
    line = error_line(capsys, lm(tokens, tmp_path / "bad", *extra))
    assert line.startswith(message), line


def test_ppo_with_lora_refuses_an_engine_that_cannot_load_adapters(tokens, tmp_path, capsys):
    """SGLang cannot swap adapters at run time: refused in one line naming the key (vLLM and
    the native server can)."""
    argv = ["train", "ppo", "--data", str(tokens / "prompts.jsonl"), "--run-dir",
            str(tmp_path / "ppo"), "--steps", "1", "--lora-rank", "2", "--set",
            "rollout.mode=async", "--set", "objective.behavior_importance=2.0", "--set",
            "rollout.engine.kind=sglang", "--set", "rollout.engine.url=http://127.0.0.1:1",
            "--set", f"rollout.engine.directory={tmp_path}"]  # fmt: skip
    line = error_line(capsys, argv)
    assert line == ("dew: error: rollout.engine.kind: a lora section needs an engine that loads "
                    "adapters at run time; expected vllm or native, got sglang"), line  # fmt: skip
    assert not (tmp_path / "ppo").exists()

"""``dew train dpo|grpo``, config files with ``--set``, ``--version`` and every ``--help``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _chat_tokenizer import build_tokenizer

from dew.cli import main

TINY_MODEL = {"name": "qwen3", "emb_features": 16, "num_layers": 1, "num_heads": 2,
              "mlp_features": 32}  # fmt: skip
TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "4", "--log-every", "1"]  # fmt: skip


def run_dew(args, **kw):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "dew.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("train")
    tok = build_tokenizer(str(base / "tok"))
    pairs = [
        {"prompt": "What is two plus two?", "chosen": " Four.", "rejected": " Five."},
        {"prompt": [{"role": "user", "content": "Weather in Paris?"}],
         "chosen": [{"role": "assistant", "content": "It is sunny."}],
         "rejected": [{"role": "assistant", "content": "No idea."}]},
    ]  # fmt: skip
    (base / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs * 2))
    prompts = [{"prompt": [{"role": "user", "content": "What is two plus two?"}],
                "ground_truth": "4"}] * 4  # fmt: skip
    (base / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    (base / "rewards_cli.py").write_text(
        "def length(data_source, completion, ground_truth, extra_info):\n"
        "    return float(len(completion)) / 100.0\n"
    )
    return base, tok


def test_version_names_the_distributions(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("dew 0.") and "dew-rl" in out and "jax" in out


@pytest.mark.parametrize(
    "command",
    [[], ["train"], ["train", "lm"], ["train", "sft"], ["train", "dpo"], ["train", "grpo"],
     ["train", "ppo"], ["chain"], ["quickstart"]],
)  # fmt: skip
def test_every_help_has_an_example(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out.lower() and "dew " in out.split("xample", 1)[1]


def test_help_matches_the_schedule_and_export_behaviour(capsys):
    with pytest.raises(SystemExit):
        main(["train", "lm", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--schedule" in out and "constant (flat at --lr), cosine or linear" in out
    assert "linear warmup from 0 to --lr, before the --schedule" in out
    assert "--export-dtype" in out and "bfloat16, float32 or float16 (default bfloat16)" in out
    assert "[optimizer.learning_rate]" in out and "(default 0.0003)" in out


def exported_dtypes(directory) -> set[str]:
    """The dtypes every tensor of an exported model.safetensors declares in its own header."""
    with open(directory / "model.safetensors", "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    assert header, "no tensors exported"
    return {entry["dtype"] for entry in header.values()}


def test_train_dpo_on_text_and_conversation_pairs(files, capsys, tmp_path):
    base, tok = files
    run_dir = tmp_path / "dpo"
    code = main(["train", "dpo", "--data", str(base / "pairs.jsonl"), "--tokenizer", tok,
                 "--run-dir", str(run_dir), "--steps", "2", "--seq-len", "48", "--beta", "0.2",
                 "--lr", "1e-3", "--export", str(tmp_path / "out"), "--export-dtype", "float16",
                 *TINY])  # fmt: skip
    assert code == 0
    assert exported_dtypes(tmp_path / "out") == {"F16"}
    assert json.load(open(tmp_path / "out" / "config.json"))["dtype"] == "float16"
    assert "trained to step 2 (2 updates)" in capsys.readouterr().out
    records = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in records)
    config = json.load(open(run_dir / "config.json"))
    assert config["kind"] == "dpo" and config["objective"]["beta"] == 0.2
    from dew.data.chat.template import ChatTokenizer

    assert config["model"]["vocab_size"] == ChatTokenizer.load(tok).tokenizer.get_vocab_size()


def test_train_grpo_with_a_reward_module_from_a_yaml_config(files, tmp_path):
    base, tok = files
    run_dir = tmp_path / "grpo"
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"run: {{run_dir: {run_dir}, steps: 1, batch: 2, log_every: 1}}\n"
        f"model: {json.dumps(TINY_MODEL)}\n"
        "optimizer: {name: adam, learning_rate: 1e-3}\n"
        f"data: {{path: {base / 'prompts.jsonl'}, tokenizer: {tok}, max_prompt_len: 24}}\n"
        "objective: {reward: rewards_cli:length, groups: 2, max_new_tokens: 4}\n"
    )
    done = run_dew(["train", "grpo", "--config", str(config), "--set", "run.steps=2",
                    "--export", str(tmp_path / "out")], cwd=base)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert exported_dtypes(tmp_path / "out") == {"BF16"}  # the default --export-dtype
    assert "trained to step 2 (2 updates)" in done.stdout
    records = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert "reward/mean" in " ".join(records[-1]) or any("reward" in k for k in records[-1])
    saved = json.load(open(run_dir / "config.json"))
    assert saved["objective"]["reward"] == "rewards_cli:length"
    assert saved["optimizer"]["name"] == "adam" and saved["run"]["steps"] == 2


def test_flags_override_the_file_and_set_overrides_flags(tmp_path):
    from dew.cli import build_parser, train_mapping

    config = tmp_path / "c.json"
    config.write_text(json.dumps({"optimizer": {"learning_rate": 1.0, "clip": 0.5},
                                  "data": {"tokens": "t.bin"}}))  # fmt: skip
    args = build_parser().parse_args(["train", "lm", "--config", str(config), "--lr", "2.0",
                                      "--set", "optimizer.clip=0", "--run-dir", "r"])  # fmt: skip
    mapping = train_mapping(args)
    assert mapping["optimizer"] == {"learning_rate": 2.0, "clip": 0}
    assert mapping["run"] == {"run_dir": "r"}
    # relative paths in a config file are read from the file's directory
    assert mapping["data"]["tokens"] == "t.bin"
    (tmp_path / "t.bin").write_bytes(b"\x01\x00")
    assert train_mapping(args)["data"]["tokens"] == str(tmp_path / "t.bin")

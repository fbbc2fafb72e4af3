"""``dew train ppo`` and PPO chain stages: runs, checkpoints with the critic, exact resume,
one-line errors naming the key."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import yaml
from _chat_tokenizer import CONVERSATIONS, build_tokenizer

from dew.cli import main
from dew.recipes.generate import load_model
from dew.recipes.train import run_train
from dew.recipes.train_config import train_config

TINY_MODEL = {"name": "qwen3", "emb_features": 16, "num_layers": 1, "num_heads": 2,
              "mlp_features": 32}  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("ppo")
    tok = build_tokenizer(str(base / "tok"))
    prompts = [
        {"prompt": [{"role": "user", "content": "What is two plus two?"}], "ground_truth": "4"},
        {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "ground_truth": "sun"},
    ]
    (base / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts * 2))
    (base / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS[:2] * 2))
    (base / "ppo_rewards_t.py").write_text(
        "def vowels(data_source, completion, ground_truth, extra_info):\n"
        "    return sum(c in 'aeiou' for c in completion) / max(len(completion), 1)\n"
    )
    return base, tok


def config_mapping(base, tok, run_dir, steps):
    return {
        "kind": "ppo",
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "log_every": 1,
                "checkpoint_every": 2, "progress": False},
        "model": TINY_MODEL,
        "optimizer": {"name": "adam", "learning_rate": 1e-3},
        "data": {"path": str(base / "prompts.jsonl"), "tokenizer": tok, "max_prompt_len": 24},
        "objective": {"reward": "ppo_rewards_t:vowels", "max_new_tokens": 4, "lam": 0.9,
                      "value_coefficient": 0.25, "epsilon_high": 0.28},
    }  # fmt: skip


def test_train_ppo_checkpoints_the_critic_and_resumes_exactly(files, tmp_path, monkeypatch):
    base, tok = files
    monkeypatch.chdir(base)
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(config_mapping(base, tok, tmp_path / "stopped", 4)))
    # the first half through the CLI, stopped at the step-2 checkpoint
    # (with a held-out reward of the policy half at step 2)
    assert main(["train", "ppo", "--config", str(path), "--set", "run.steps=2", "--eval-every",
                 "2", "--val-data", str(base / "prompts.jsonl")]) == 0  # fmt: skip
    assert (tmp_path / "stopped" / "checkpoints").is_dir()
    records = [json.loads(x) for x in open(tmp_path / "stopped" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert 0.0 <= records[-1]["val/reward"] <= 1.0 and records[-1]["val/prompts"] == 4
    # the critic learns (a nonzero value loss), so the exact match below needs its checkpoint
    assert all(np.isfinite(r["loss"]) and r["critic/loss"] > 0 for r in records)
    resumed = run_train(train_config(config_mapping(base, tok, tmp_path / "stopped", 4), "ppo"))
    whole = run_train(train_config(config_mapping(base, tok, tmp_path / "whole", 4), "ppo"))
    assert int(resumed.step) == int(whole.step) == 4
    assert set(whole.params["params"]) == {"policy", "critic"}
    a, b = jax.tree.leaves(jax.device_get(resumed.params)), jax.tree.leaves(whole.params)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    # dew generate / dew eval read the policy half of a PPO run's checkpoint
    loaded = load_model(str(tmp_path / "whole"))
    a = jax.tree.leaves(loaded.variables["params"])
    b = jax.tree.leaves(whole.params["params"]["policy"])
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("objective.gamma=1.5", "objective.gamma: expected a number in [0, 1], got 1.5"),
        ("objective.lam=-0.1", "objective.lam: expected a number in [0, 1], got -0.1"),
        ("objective.value_clip=0", "objective.value_clip: expected a number > 0, got 0.0"),
        ("objective.value_coefficient=x", "objective.value_coefficient: expected"),
        ("objective.critic_from_policy=maybe", "objective.critic_from_policy: expected"),
        ("objective.epsilon_low=-1", "objective.epsilon_low"),
        ("objective.sequence_mask=[0.5,2]", "objective.sequence_mask: unknown key"),
    ],
)
def test_bad_ppo_options_give_one_line_naming_the_key(files, tmp_path, capsys, override,
                                                      message):  # fmt: skip
    base, tok = files
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(config_mapping(base, tok, tmp_path / "run", 2)))
    assert main(["train", "ppo", "--config", str(path), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dew: error: ") and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_chain_trains_sft_then_ppo(files, tmp_path, capsys):
    base, tok = files
    config = {
        "output": str(tmp_path / "chain"), "batch": 2, "log_every": 1,
        "model": {**TINY_MODEL, "vocab_size": 420, "max_seq_len": 128},
        "optimizer": {"name": "adam", "learning_rate": 1e-3},
        "stages": [
            {"name": "sft", "steps": 1,
             "data": {"type": "ChatMessages", "path": str(base / "chat.jsonl"),
                      "tokenizer": tok, "seq_len": 95}},
            {"name": "ppo", "kind": "ppo", "steps": 2, "reward": "ppo_rewards_t:vowels",
             "groups": 1, "max_new_tokens": 4, "gamma": 0.99, "value_clip": 0.5,
             "data": {"type": "Prompts", "path": str(base / "prompts.jsonl"), "tokenizer": tok,
                      "max_prompt_len": 24}},
        ],
    }  # fmt: skip
    path = base / "chain_ppo.json"
    path.write_text(json.dumps(config))
    assert main(["chain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ppo (ppo): step 2, 2 updates" in out and "sft (sft): step 1" in out
    records = [json.loads(x) for x in open(tmp_path / "chain" / "ppo" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2] and all("critic/error" in r for r in records)
    bad = json.loads(json.dumps(config))
    bad["stages"][1]["lam"] = 2
    path.write_text(json.dumps(bad))
    assert main(["chain", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Stage.lam (ppo): expected a number in [0, 1], got 2" in err
    bad["stages"][1]["lam"], bad["stages"][0]["kind"] = 0.9, "ppo"
    path.write_text(json.dumps(bad))
    assert main(["chain", str(path)]) == 2
    assert "Stage.kind (sft): expected sft or lm for ChatMessages data, got 'ppo'" in (
        capsys.readouterr().err
    )

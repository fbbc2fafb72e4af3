"""Held-out reward of RL runs (``val/reward``) and each objective's key metrics on the
console line of ``dew train``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _chat_tokenizer import build_tokenizer

from dew.cli import main

TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "2", "--log-every", "1", "--lr", "1e-3"]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    tok = build_tokenizer(str(base / "tok"))
    prompts = [
        {"prompt": [{"role": "user", "content": "What is two plus two?"}], "ground_truth": "4"},
        {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "ground_truth": "sun"},
    ]
    (base / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts * 2))
    (base / "val.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts[::-1] * 2))
    (base / "key_metric_rewards_t.py").write_text(
        "def vowels(data_source, completion, ground_truth, extra_info):\n"
        "    return sum(c in 'aeiou' for c in completion) / max(len(completion), 1)\n"
    )
    pairs = [{"prompt": "What is two plus two?", "chosen": " Four.", "rejected": " Five."}]
    (base / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs * 4))
    return base, tok


def test_grpo_reports_held_out_reward_and_mean_reward(files, tmp_path, capsys, monkeypatch):
    base, tok = files
    monkeypatch.chdir(base)
    run_dir = tmp_path / "grpo"
    code = main(["train", "grpo", "--data", str(base / "prompts.jsonl"), "--tokenizer", tok,
                 "--val-data", str(base / "val.jsonl"), "--eval-every", "2", "--run-dir",
                 str(run_dir), "--steps", "2", "--max-prompt-len", "24", "--groups", "2",
                 "--max-new-tokens", "4", "--reward", "key_metric_rewards_t:vowels", *TINY])  # fmt: skip
    assert code == 0
    records = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    last = records[-1]
    assert last["step"] == 2 and 0.0 <= last["val/reward"] <= 1.0
    assert last["val/reward_stderr"] >= 0.0 and np.isfinite(last["val/reward_stderr"])
    assert last["val/prompts"] == 4
    assert "val/reward" not in records[0]  # only when the evaluation is due
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dew: step")]
    assert len(lines) == 2 and all(" reward/mean " in x for x in lines)
    assert f" val/reward {last['val/reward']:.4g} " in lines[-1] and "val/prompts 4" in lines[-1]


def test_dpo_shows_accuracy_and_margin(files, tmp_path, capsys):
    base, tok = files
    code = main(["train", "dpo", "--data", str(base / "pairs.jsonl"), "--tokenizer", tok,
                 "--run-dir", str(tmp_path / "dpo"), "--steps", "1", "--seq-len", "32", *TINY])  # fmt: skip
    assert code == 0
    record = json.loads(open(tmp_path / "dpo" / "metrics.jsonl").readline())
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dew: step")]
    for name in ("loss", "rewards/accuracy", "rewards/margin"):
        assert f" {name} {record[name]:.4g} " in line, line

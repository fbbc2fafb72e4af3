"""The ``dew`` console script: help, LM training with resume, SFT on conversations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _chat_tokenizer import CONVERSATIONS, build_tokenizer

from dew.cli import build_parser, main
from dew.data import write_tokens

TINY = ["--model", "qwen3", "--emb-features", "16", "--layers", "1", "--heads", "2",
        "--mlp-features", "32", "--batch", "4", "--log-every", "1", "--lr", "1e-2"]  # fmt: skip


def dew_script() -> list[str]:
    exe = shutil.which("dew", path=os.path.dirname(sys.executable))
    assert exe is not None, "the dew console script is not installed next to the interpreter"
    return [exe]


def run(args, **kw):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(dew_script() + args, capture_output=True, text=True, env=env,
                          timeout=300, **kw)  # fmt: skip
    return proc


def test_help_is_complete():
    out = run(["train", "lm", "--help"])
    assert out.returncode == 0
    parser = build_parser()
    lm = (
        parser._subparsers._group_actions[0]
        .choices["train"]
        ._subparsers._group_actions[0]
        .choices["lm"]
    )
    for action in lm._actions:
        for flag in action.option_strings:
            assert flag in out.stdout
        assert action.help, f"{action.option_strings} has no help"
    top = run(["--help"])
    assert top.returncode == 0 and "train" in top.stdout
    sft = run(["train", "sft", "--help"])
    assert "--tokenizer" in sft.stdout and "--data" in sft.stdout


def test_train_lm_resumes(tmp_path):
    rng = np.random.default_rng(0)
    tokens = write_tokens(tmp_path / "tokens.bin", rng.integers(0, 50, size=4000))
    run_dir = tmp_path / "run"
    base = ["train", "lm", "--tokens", tokens, "--run-dir", str(run_dir), "--seq-len", "16",
            "--eos-id", "0", "--checkpoint-every", "2", *TINY]  # fmt: skip
    first = run([*base, "--steps", "3"])
    assert first.returncode == 0, first.stderr[-2000:]
    assert "trained to step 3" in first.stdout
    second = run([*base, "--steps", "5"])
    assert second.returncode == 0, second.stderr[-2000:]
    assert "trained to step 5 (5 updates)" in second.stdout
    steps = [json.loads(x)["step"] for x in open(run_dir / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5]
    records = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    assert all("learning_rate" in r and r["learning_rate"] == pytest.approx(1e-2) for r in records)
    other = run([*base[:-2], "--steps", "6", "--layers", "2"])
    assert other.returncode != 0 and "other settings" in other.stderr


def test_train_lm_resumes_from_a_relative_run_dir(tmp_path):
    """The same command twice with ``--run-dir runs/lm`` from the data's directory: the
    second run continues the first (it used to stop with orbax's 'should be absolute')."""
    rng = np.random.default_rng(1)
    write_tokens(tmp_path / "tokens.bin", rng.integers(0, 50, size=2000))
    base = ["train", "lm", "--tokens", "tokens.bin", "--run-dir", "runs/lm", "--seq-len", "16",
            "--eos-id", "0", "--checkpoint-every", "2", *TINY]  # fmt: skip
    first = run([*base, "--steps", "2"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run([*base, "--steps", "3"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "trained to step 3 (3 updates)" in second.stdout
    steps = [json.loads(x)["step"] for x in open(tmp_path / "runs" / "lm" / "metrics.jsonl")]
    assert steps == [1, 2, 3]


def test_fresh_moves_the_old_run_aside_and_resume_from_picks_a_checkpoint(tmp_path):
    rng = np.random.default_rng(2)
    write_tokens(tmp_path / "tokens.bin", rng.integers(0, 50, size=2000))
    base = ["train", "lm", "--tokens", "tokens.bin", "--run-dir", "run", "--seq-len", "16",
            "--eos-id", "0", "--checkpoint-every", "1", "--set", "run.keep=10", *TINY]  # fmt: skip
    first = run([*base, "--steps", "3"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    straight = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    # --resume-from a step: steps 2 and 3 are trained again from step 1's checkpoint
    again = run([*base, "--steps", "3", "--resume-from", "1"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trained to step 3 (3 updates)" in again.stdout
    redone = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in redone] == [1, 2, 3]
    assert [r["loss"] for r in redone] == [r["loss"] for r in straight]  # the same steps
    # --resume-from a checkpoint directory of another run starts this one there
    step2 = tmp_path / "run" / "checkpoints" / "step_00000002"
    other = [a if a != "run" else "other" for a in base]
    moved = run([*other, "--steps", "3", "--resume-from", str(step2)], cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert [json.loads(x)["step"] for x in open(tmp_path / "other" / "metrics.jsonl")] == [3]
    # --fresh keeps the old run under another name and trains from step 0
    fresh = run([*base, "--steps", "2", "--fresh"], cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert f"dew: moved the earlier run to {old.name}" in fresh.stdout
    assert sorted(p.name for p in (old / "checkpoints").iterdir())[-1] == "step_00000003"
    assert [json.loads(x)["step"] for x in open(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    for flags, message in [
        (["--resume-from", "7"], "run.resume_from: run has no checkpoint of step 7 "
                                 "(its checkpoints: 1, 2)"),
        (["--resume-from", "nowhere"], "run.resume_from: 'nowhere' is neither a step number"),
        (["--fresh", "--resume-from", "1"], "run.fresh: starts over, while run.resume_from"),
    ]:  # fmt: skip
        bad = run([*base, "--steps", "3", *flags], cwd=tmp_path)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.strip().splitlines() == [
            line for line in bad.stderr.strip().splitlines() if line.startswith("dew: error: ")
        ]
        assert bad.stderr.strip().startswith(f"dew: error: {message}"), bad.stderr


def test_pretrained_takes_a_hub_id_from_the_hugging_face_cache(tmp_path):
    """``--pretrained org/name`` reads the snapshot the Hugging Face cache holds (built here
    by hand: no network), and an id the cache lacks is one line saying so."""
    rng = np.random.default_rng(3)
    write_tokens(tmp_path / "tokens.bin", rng.integers(0, 50, size=2000))
    base = ["train", "lm", "--tokens", "tokens.bin", "--seq-len", "16", "--eos-id", "0",
            "--steps", "1", *TINY]  # fmt: skip
    made = run([*base, "--run-dir", "first", "--export", "exported", "--export-dtype",
                "float32"], cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(tmp_path / "exported", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_CACHE=str(tmp_path / "hub"),
               HF_HUB_OFFLINE="1")  # fmt: skip

    def dew(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(dew_script() + [*base, *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)  # fmt: skip

    loaded = dew("--run-dir", "second", "--pretrained", "org/tiny")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "trained to step 1" in loaded.stdout
    missing = dew("--run-dir", "third", "--pretrained", "org/absent")
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith(
        "dew: error: model.pretrained: no such directory 'org/absent', and the Hugging Face "
        "cache does not hold it either ("
    ), line


def test_mlflow_gets_the_config_as_params_and_a_resumed_eta_skips_the_restore(
    tmp_path, monkeypatch
):
    """Through the command: the MLflow run holds the resolved config as params; off a
    terminal, the first line after a resume says ETA ? (its time is the restore and the
    compilation) and the next gives a time."""
    import re

    rng = np.random.default_rng(4)
    write_tokens(tmp_path / "tokens.bin", rng.integers(0, 50, size=2000))
    base = ["train", "lm", "--tokens", "tokens.bin", "--run-dir", "run", "--seq-len", "16",
            "--eos-id", "0", "--checkpoint-every", "3", "--trackers", "mlflow", *TINY]  # fmt: skip
    first = run([*base, "--steps", "3"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run([*base, "--steps", "6"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    lines = [x for x in again.stderr.splitlines() if x.startswith("dew: step ")]
    assert [x.split("  ")[0] for x in lines] == ["dew: step 4/6", "dew: step 5/6", "dew: step 6/6"]
    assert lines[0].endswith("ETA ?") and re.search(r"ETA \d+:\d\d:\d\d$", lines[1]), lines
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    run_id = (tmp_path / "run" / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri="file:" + str(tmp_path / "run" / "mlruns"))
    params = client.get_run(run_id).data.params
    assert params["kind"] == "lm" and params["run.steps"] == "3"  # the config that made it
    assert params["optimizer.learning_rate"] == "0.01" and params["data.seq_len"] == "16"
    losses = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in losses) == [1, 2, 3, 4, 5, 6]


def test_train_sft(tmp_path, capsys):
    tok = build_tokenizer(str(tmp_path / "tok"))
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS * 2) + "\n")
    run_dir = tmp_path / "run"
    code = main(["train", "sft", "--data", str(data), "--tokenizer", tok, "--run-dir",
                 str(run_dir), "--seq-len", "191", "--steps", "3", "--val-data", str(data),
                 "--eval-every", "3", "--export", str(tmp_path / "out"), *TINY])  # fmt: skip
    assert code == 0
    assert "trained to step 3" in capsys.readouterr().out
    last = [json.loads(x) for x in open(run_dir / "metrics.jsonl")][-1]
    assert last["step"] == 3 and np.isfinite(last["val/perplexity"])
    config = json.load(open(run_dir / "config.json"))
    from dew.data.chat.template import ChatTokenizer

    vocab = ChatTokenizer.load(tok).tokenizer.get_vocab_size()
    assert config["model"]["vocab_size"] == vocab and config["kind"] == "sft"
    # the exported directory carries the tokenizer beside the weights, byte for byte
    from tokenizers import Tokenizer

    out = tmp_path / "out"
    assert (out / "model.safetensors").is_file()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tmp_path / "tok" / name).read_bytes()
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == vocab
    exported = ChatTokenizer.load(out)
    assert exported.encode("hello") == ChatTokenizer.load(tok).encode("hello")

"""``dew train grpo`` with ``rollout.engine.launch``: an engine that never answers and a
port already taken are one-line errors naming their key, the stand-in engine (a shell
script in place of the engine's interpreter) is stopped, and no ``config.json`` is left."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from dew import models
from dew.cli import main
from dew.models import Pretrained
from dew.testing import alive


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A small Qwen3 checkpoint (an architecture vLLM serves) and token-id prompts."""
    folder = tmp_path_factory.mktemp("engine_errors")
    model = models.build("qwen3", vocab_size=64, emb_features=32, num_layers=1, num_heads=2,
                         mlp_features=64, max_seq_len=64)  # fmt: skip
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    Pretrained.from_model(model, jax.tree.map(np.asarray, variables)).save(
        folder / "start", dtype="float32"
    )
    rows = [{"prompt": [5 + i, 17, 40], "ground_truth": "1"} for i in range(4)]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def sleeper(folder: Path) -> tuple[Path, Path]:
    """A never-ready engine interpreter that writes its pid to a file, and that file."""
    pid_file = folder / "engine.pid"
    path = folder / "python"
    path.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    path.chmod(0o755)
    return path, pid_file


def run(base: Path, folder: Path, launch: dict, capsys) -> tuple[int, str]:
    run_dir = folder / "run"
    config = {
        "run": {"run_dir": str(run_dir), "steps": 2, "batch": 2, "progress": False},
        "model": {"pretrained": str(base / "start")},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": "math", "groups": 2, "max_new_tokens": 4,
                      "behavior_importance": 2.0},
        "rollout": {"mode": "async", "engine": {"kind": "vllm", "launch": launch}},
    }  # fmt: skip
    path = folder / "grpo.yaml"
    path.write_text(json.dumps(config))
    code = main(["train", "grpo", "--config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not (run_dir / "config.json").exists()
    return code, err[0]


def test_an_engine_that_never_answers_is_named_and_stopped(base, tmp_path, capsys):
    python, pid_file = sleeper(tmp_path)
    code, line = run(base, tmp_path, {"python": str(python), "ready_timeout": 2}, capsys)
    assert code == 2
    assert line.startswith("dew: error: rollout.engine.launch.ready_timeout: "), line
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the engine outlived the failed start"


def test_a_port_in_use_is_named(base, tmp_path, capsys):
    python, pid_file = sleeper(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, line = run(base, tmp_path, {"python": str(python), "port": port}, capsys)
    assert code == 2
    assert line.startswith("dew: error: rollout.engine.launch.port: "), line
    assert str(port) in line and not pid_file.exists()  # nothing was started

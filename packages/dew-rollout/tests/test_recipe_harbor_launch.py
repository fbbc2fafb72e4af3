"""``source: {kind: harbor}`` with an engine Dew launches: ``dew train grpo --config`` starts
the real vLLM CPU engine on the policy with a chat tokenizer (``rollout.engine.launch.tokenizer``),
adds it as a worker of a real rllm-model-gateway that started with none, runs stand-in Harbor
trials (harbor_standin.py) whose agents chat with it through the run's sandbox proxy, trains
on the recorded calls with pushes, and on exit takes the worker off the gateway and stops the
engine. A launch without a tokenizer is refused before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from gateway_fakes import MODEL, GatewayProcess
from rollout_engine import chat_tokenizer, engine_cpus
from test_recipe_harbor import harbor_config

from dew.cli import main
from dew.rollout import SafetensorsReload


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    process = GatewayProcess(None, tmp_path_factory.mktemp("gateway"))
    yield process
    process.close()


def launch_config(base: Path, gateway: GatewayProcess, launch: dict) -> Path:
    """The Harbor example's config (test_recipe_harbor.harbor_config) with a launched engine."""
    path = harbor_config(base, types.SimpleNamespace(url="http://127.0.0.1:1"), gateway)
    config = yaml.safe_load(path.read_text())
    config["rollout"]["engine"] = {"kind": "vllm", "launch": launch}
    config["source"]["model"] = f"hosted_vllm/{MODEL}"  # a launched engine serves the tail
    config["source"].pop("regrade")
    path.write_text(json.dumps(config))
    return path


def run(config: Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                           str(config)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def live_engines(marker: str) -> list[str]:
    """Command lines of running processes that mention ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in line and "vllm" in line:
            found.append(line)
    return found


def test_train_grpo_on_harbor_trials_against_a_launched_engine(
    vllm_env_python, gateway, pretrained, tmp_path
):
    python = vllm_env_python
    writer = SafetensorsReload(pretrained, tmp_path / "policy", ["http://127.0.0.1:1"])
    writer.write()  # the policy the run starts from (model.pretrained)
    writer.close()
    tokenizer = chat_tokenizer(tmp_path / "tokenizer")
    launch = {"python": str(python), "cpus": engine_cpus() or None, "tokenizer": str(tokenizer),
              "ready_timeout": 400,
              "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}}  # fmt: skip
    config = launch_config(tmp_path, gateway, launch)
    done = run(config, tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "trained to step 2 (2 updates)" in done.stdout
    work = tmp_path / "run"
    log = (work / "engine.log").read_text()
    assert f"--tokenizer {tokenizer}" in log and "--skip-tokenizer-init" not in log
    assert f"--served-model-name {MODEL}" in log
    drawn = [json.loads(line) for line in open(work / "rollout.jsonl")]
    assert [r["pushed"] for r in drawn] == [-1, 1]
    assert all(r["admitted_groups"] == 2 for r in drawn)
    metrics = [json.loads(line) for line in open(work / "metrics.jsonl")]
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics if "loss" in m)
    paths = list((work / "trials").glob("*/result.json"))
    assert len(paths) >= 2 * 2 * 2  # batches x tasks x groups, each a trial the engine answered
    # the run took its worker off the gateway and left no engine behind
    assert httpx.get(f"{gateway.url}/admin/workers", timeout=10).json() == []
    assert live_engines(str(work / "engine" / "policy")) == []


def test_a_launch_without_a_tokenizer_is_refused_by_name(gateway, tmp_path, capsys):
    config = launch_config(tmp_path, gateway, {"python": sys.executable})
    assert main(["train", "grpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("dew: error: rollout.engine.launch.tokenizer: source.kind harbor")
    assert not (tmp_path / "run" / "engine.log").exists()

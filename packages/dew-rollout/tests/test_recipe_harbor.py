"""``source: {kind: harbor}`` from one config: ``python -m dew.cli train grpo --config`` runs
stand-in Harbor trials (harbor_standin.py) whose agents reach ``FakeChatVLLM`` through the
real rllm-model-gateway and the run's own sandbox proxy, trains on the recorded calls and
pushes each update's weights into the engine (the fake takes vLLM's reload routes), with
``source.regrade`` on: every trial is re-graded by ``harbor trial regrade`` and the counts
reach rollout.jsonl. The config is examples/harbor/grpo.yaml with this machine's addresses
and a shorter run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from gateway_fakes import MODEL, FakeChatVLLM, GatewayProcess
from test_rollout_harbor import STANDIN, make_task

from dew.cli import main
from dew.rollout import SafetensorsReload
from dew.testing import checkpoint_arrays, free_port

#: The fake engine answers a prompt the same way every time and Harbor gives trials no seed,
#: so both trials of a task draw the same calls; this verifier scores a task's trials 0, 1,
#: 0, ... in the order they finish (one worker: the order they were submitted in), so every
#: group holds two different rewards and every update has a learning signal. The verifier is a
#: separate-mode one (run from a copy of tests/, so its state lives at the task's absolute
#: path); re-graded (``REGRADE`` set through ``source.regrade.verifier_env``) it repeats the
#: reward of the task's latest trial, which with one worker is the trial being re-graded.
ALTERNATE = """#!/bin/sh
if [ -n "$REGRADE" ]; then cat "{task}/latest" > "$REWARD_FILE"; exit 0; fi
n=0
while ! mkdir "{task}/graded.$n" 2>/dev/null; do n=$((n + 1)); done
echo $((n % 2)) | tee "{task}/latest" > "$REWARD_FILE"
"""
SEPARATE = '\n[verifier]\nenvironment_mode = "separate"\n'


@pytest.fixture(scope="module")
def engine_and_gateway(tmp_path_factory):
    engine = FakeChatVLLM()
    gateway = GatewayProcess(engine.url, tmp_path_factory.mktemp("gateway"))
    yield engine, gateway
    gateway.close()
    engine.close()


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "harbor" / "grpo.yaml"


def harbor_config(base: Path, engine: FakeChatVLLM, gateway: GatewayProcess) -> Path:
    """examples/harbor/grpo.yaml with this machine's addresses, the stand-in Harbor and a
    short run: only what cannot be the example's own value is replaced."""
    checkpoint = base / "policy"
    for name in ("one", "two"):
        task = base / "tasks" / name
        make_task(base / "tasks", name, grade=ALTERNATE.format(task=task))
        with open(task / "task.toml", "a") as toml:
            toml.write(SEPARATE)
    config = yaml.safe_load(EXAMPLE.read_text())
    config["run"].update(run_dir=str(base / "run"), steps=2, batch=2, checkpoint_every=1,
                         progress=False)  # fmt: skip
    config["model"]["pretrained"] = str(checkpoint)
    config["optimizer"]["learning_rate"] = 1e-2
    config["objective"]["groups"] = 2
    config["rollout"]["engine"].update(url=engine.url, directory=str(checkpoint))
    config["source"].update(harbor=STANDIN, agent="stand-in", model=MODEL, args=[],
                            ready_timeout=60, workers=1, width=128,
                            regrade={"verifier_env": {"REGRADE": "1"}})  # fmt: skip
    config["source"]["gateway"].update(url=gateway.url, timeout=10)
    path = base / "harbor.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML; tasks is read from the file's folder
    return path


def test_train_grpo_on_harbor_trials_from_one_config(engine_and_gateway, pretrained, tmp_path):
    engine, gateway = engine_and_gateway
    writer = SafetensorsReload(pretrained, tmp_path / "policy", [engine.url])
    writer.write()
    writer.close()
    config = harbor_config(tmp_path, engine, gateway)
    answers, reloads = len(engine.answers), engine.reloads
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    elsewhere = tmp_path / "elsewhere"  # relative keys are read from the config's folder
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                           str(config)], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "trained to step 2 (2 updates)" in done.stdout
    run = tmp_path / "run"
    drawn = [json.loads(line) for line in open(run / "rollout.jsonl")]
    assert [r["index"] for r in drawn] == [0, 1]
    assert [r["pushed"] for r in drawn] == [-1, 1]
    assert all(r["admitted_groups"] == 2 for r in drawn)  # both tasks' trials trained on
    paths = list((run / "trials").glob("*/result.json"))
    results = [json.loads(p.read_text()) for p in paths if not p.parent.name.endswith("-regrade")]
    assert len(results) >= 2 * 2 * 2  # batches x tasks x groups, one trial each
    # every admitted trial was re-graded first, in agreement; counted in the records
    regraded = [p for p in paths if p.parent.name.endswith("-regrade")]
    assert len(results) >= len(regraded) >= drawn[-1]["regrade/regraded"] >= 2 * 2 * 2
    assert drawn[-1]["regrade/agreed"] == drawn[-1]["regrade/regraded"]
    assert drawn[-1]["regrade/rejected"] == drawn[-1]["regrade/failed"] == 0
    assert all(r["verifier_result"]["rewards"]["reward"] in (0.0, 1.0) for r in results)
    # every turn of every trial went to the engine through the gateway: two per trial
    assert len(engine.answers) - answers >= 2 * len(results)
    # version 0 before the first trial, then the first update's weights (and the last's)
    assert engine.reloads - reloads >= 2
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]
    assert all(np.isfinite(m["loss"]) for m in metrics if "loss" in m)
    assert all(m["grad_norm"] > 0 for m in metrics if "loss" in m)  # the calls taught something
    saved = json.loads((run / "config.json").read_text())["source"]
    assert saved["tasks"] == str(tmp_path / "tasks") and saved["kind"] == "harbor"
    assert checkpoint_arrays(run)  # the trained policy was checkpointed


@pytest.mark.parametrize("dead", ["engine", "gateway"])
def test_an_engine_or_gateway_that_does_not_answer_is_one_line_naming_its_key(
    engine_and_gateway, pretrained, tmp_path, capsys, dead
):
    engine, gateway = engine_and_gateway
    writer = SafetensorsReload(pretrained, tmp_path / "policy", [engine.url])
    writer.write()
    writer.close()
    path = harbor_config(tmp_path, engine, gateway)
    config = json.loads(path.read_text())
    nobody = f"http://127.0.0.1:{free_port()}"
    if dead == "engine":
        config["rollout"]["engine"]["url"] = nobody
        message = f"rollout.engine.url: expected a running engine, got {nobody} ("
    else:
        config["source"]["gateway"]["url"] = nobody
        message = f"source.gateway.url: expected a running rllm-model-gateway, got {nobody} ("
    path.write_text(json.dumps(config))
    assert main(["train", "grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dew: error: {message}"), err
    assert not (tmp_path / "run" / "config.json").exists()

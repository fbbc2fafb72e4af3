"""``dew train grpo --config`` with ``rollout.engine: {kind: vllm, launch: ...}`` against the
real vLLM CPU engine (two launches, a few minutes). Dew writes the starting checkpoint,
starts the engine, trains one batch ahead with a push before each draw, leaves the engine
serving the trained weights, and stops it. One run is SIGINTed after its first checkpoint:
it stops its engine, keeps the checkpoint, and the rerun resumes with an engine of its
own and trains to the end. That resumed run is the one the other checks read: the
engine's prompt log-probabilities for the final weights, written to
``RUN_DIR/engine-check.json``, are checked against Dew's own scoring of the final
checkpoint, the batches keep the one-ahead schedule across the stop, and no engine process
may outlive either command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from rollout_engine import engine_cpus, score_chains, tiny_pretrained

from dew.recipes.generate import load_model
from dew.testing import wait_for_checkpoint

TOLERANCE = 2e-4  # float32 kernels summed in another order (as test_rollout_vllm_engine.py)
STEPS = 3
REWARD = """def even(data_source, completion, ground_truth, extra_info):
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))
"""


def bf16(variables):
    return jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16).astype(np.float32),
                        variables)  # fmt: skip


def engine_processes(folder: Path) -> list[int]:
    """Pids whose command line names ``folder`` (the engine and its watchdog)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder).encode() in command and state != "Z":
            found.append(int(entry.name))
    return found


def write_config(base: Path, run_dir: Path, python: Path, steps: int) -> Path:
    launch = {"python": str(python.parent.parent), "cpus": engine_cpus() or None,
              "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "ready_timeout": 900}  # fmt: skip
    config = {
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": {"pretrained": str(base / "start")},
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": "rewards_vllm_train:even", "groups": 2, "max_new_tokens": 6,
                      "behavior_importance": 2.0},
        "rollout": {"mode": "async", "ahead": 1, "truncation": "score",
                    "engine": {"kind": "vllm", "launch": launch}},
    }  # fmt: skip
    path = base / f"{run_dir.name}.yaml"
    path.write_text(json.dumps(config))
    return path


def dew_train(config: Path, base: Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                             str(config)], cwd=base, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture(scope="module")
def prepared(vllm_env_python, tmp_path_factory):
    """The engine's python, a folder with the starting checkpoint, prompts and reward."""
    python = vllm_env_python
    base = tmp_path_factory.mktemp("vllm_train")
    start = tiny_pretrained()
    start.save(base / "start", dtype="float32")
    rows = [{"prompt": [5 + i, 17, 40 + 3 * i], "ground_truth": "x"} for i in range(8)]
    (base / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (base / "rewards_vllm_train.py").write_text(REWARD)
    return python, base, start


@dataclass
class Stopped:
    """A run SIGINTed after its first checkpoint, then run again to the end."""

    start: Any  # the starting Pretrained
    run_dir: Path
    stopped: subprocess.CompletedProcess  # the SIGINTed command
    left: list[int]  # engine processes alive right after it exited
    saved: list[str]  # its checkpoints
    resumed: subprocess.CompletedProcess  # the rerun


@pytest.fixture(scope="module")
def trained(prepared):
    python, base, start = prepared
    run_dir = base / "stopped"
    config = write_config(base, run_dir, python, STEPS)
    proc = dew_train(config, base)
    assert wait_for_checkpoint(proc, run_dir, 1200), "the run ended before it could be stopped"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    stopped = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    left = engine_processes(run_dir / "engine" / "policy")
    saved = sorted(n for n in os.listdir(run_dir / "checkpoints") if n.startswith("step_"))
    again = dew_train(config, base)
    out, err = again.communicate(timeout=1500)
    resumed = subprocess.CompletedProcess(again.args, again.returncode, out, err)
    return Stopped(start, run_dir, stopped, left, saved, resumed)


def test_sigint_stops_the_engine_keeps_a_checkpoint_and_the_run_resumes(trained):
    stopped = trained.stopped
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert "dew: SIGINT: stopped after step" in stopped.stderr
    assert trained.left == [], "SIGINT left the engine running"
    assert trained.saved and trained.saved[-1] < f"step_{STEPS:08d}"
    out, err = trained.resumed.stdout, trained.resumed.stderr
    assert f"trained to step {STEPS}" in out, err[-3000:]
    assert f"dew: the engine serves version {STEPS};" in out
    launches = [line for line in (trained.run_dir / "engine.log").read_text().splitlines()
                if line.startswith("=== dew: vllm engine launched")]  # fmt: skip
    assert len(launches) == 2  # the resumed run started its own engine


def test_the_command_launches_vllm_trains_ahead_and_stops_it(trained):
    run_dir, done = trained.run_dir, trained.resumed
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"trained to step {STEPS}" in done.stdout
    assert f"dew: the engine serves version {STEPS};" in done.stdout
    records = [json.loads(line) for line in open(run_dir / "rollout.jsonl")]
    lags = {r["index"]: r["lag"] for r in records}  # the last record of each batch
    assert lags == {0: 0, 1: 1, 2: 1}, records  # one ahead, across the stop too
    pushes = {r["pushed"] for r in records if r["pushed"] is not None and r["pushed"] > 0}
    assert len(pushes) >= 2, records
    folder = run_dir / "engine" / "policy"
    assert (folder / "config.json").exists()
    assert engine_processes(folder) == [], "an engine process outlived dew train"
    log = (run_dir / "engine.log").read_text().splitlines()
    assert log[0].startswith("=== dew: vllm engine launched") and str(folder) in log[0]


def test_the_engine_served_the_trained_weights(trained):
    start, run_dir, done = trained.start, trained.run_dir, trained.resumed
    assert done.returncode == 0, done.stderr[-4000:]
    check = json.loads((run_dir / "engine-check.json").read_text())
    assert check["version"] == STEPS
    final = load_model(str(run_dir))
    ours = score_chains(start, bf16(final.variables), check["ids"])  # the same architecture
    before = score_chains(start, bf16(start.variables), check["ids"])
    worst = 0.0
    for engine, mine, old in zip(check["engine"], ours, before, strict=True):
        engine = np.asarray(engine, np.float32)
        np.testing.assert_allclose(engine, mine, atol=TOLERANCE)
        worst = max(worst, float(np.abs(engine - mine).max()))
        assert np.abs(engine - old).max() > 10 * TOLERANCE  # training moved what is served
    assert check["max_abs_difference"] == pytest.approx(worst, abs=1e-6)
    print(f"engine vs Dew on the final checkpoint: max abs difference {worst:.3g}")

"""``rollout.mode: async`` through the command line: ``dew train grpo`` and a ``dew chain``
GRPO stage draw one batch ahead on the native engine, and a ``dew train grpo`` process killed
with SIGKILL after its first checkpoint resumes to the bit-identical final state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dew.cli import main

MODEL = {"name": "causal_transformer", "vocab_size": 32, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32}  # fmt: skip
#: Each completion is scored after a short sleep, so a batch takes a moment to draw and a
#: process can be killed between two checkpoints; the score itself does not depend on time.
REWARD = """import time


def even(data_source, completion, ground_truth, extra_info):
    time.sleep(DELAY)
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


DELAY = {delay}
"""


def write_files(base: Path, delay: float = 0.0) -> str:
    """Token-id prompts and a reward module (a unique name: modules stay in sys.modules)."""
    rows = [{"prompt": [1 + i % 5, 2, 3 + i % 7], "ground_truth": "x"} for i in range(16)]
    (base / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = f"rewards_async_{abs(hash((str(base), delay))) % 10**8}"
    (base / f"{name}.py").write_text(REWARD.format(delay=delay))
    return name


def grpo_config(base: Path, run_dir: Path, reward: str, steps: int) -> Path:
    config = {
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": MODEL,
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": f"{reward}:even", "groups": 2, "max_new_tokens": 6,
                      "eos_id": 0, "behavior_importance": 2.0},
        "rollout": {"mode": "async", "ahead": 1, "truncation": "score",
                    "engine": {"kind": "native"}},
    }  # fmt: skip
    path = base / f"{run_dir.name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "rollout.jsonl")]


def final_leaves(run_dir: Path) -> list[np.ndarray]:
    """Every array of the run's newest checkpoint (step, updates, params, optimizer, RNG)."""
    import jax

    from dew.trainer import checkpoint

    restored = checkpoint.latest(run_dir)
    assert restored is not None
    meta = restored.meta
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d))
                for s, d in zip(meta["shapes"], meta["dtypes"])]  # fmt: skip
    leaves = checkpoint.restore_into(template, [device] * len(template), restored)
    return [checkpoint.to_host(x) for x in leaves]


def test_train_grpo_async_draws_one_batch_ahead(tmp_path, monkeypatch, capsys):
    reward = write_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", "grpo", "--config", str(grpo_config(tmp_path, run_dir, reward, 4))]) == 0
    assert "trained to step 4 (4 updates)" in capsys.readouterr().out
    drawn = records(run_dir)
    # batch i was submitted before update i - 1: it trains one update behind its weights
    assert [r["index"] for r in drawn] == [0, 1, 2, 3]
    assert [r["lag"] for r in drawn] == [0, 1, 1, 1]
    assert [r["version"] for r in drawn] == [0, 0, 1, 2]
    assert [r["pushed"] for r in drawn] == [-1, 1, 2, 3]
    assert all(r["admitted_groups"] == 2 for r in drawn)
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(np.isfinite(m["loss"]) for m in metrics)
    saved = json.load(open(run_dir / "config.json"))
    assert saved["rollout"]["mode"] == "async" and saved["rollout"]["max_lag"] == 1


def dew_process(config: Path, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                             str(config)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_sigkill_after_a_checkpoint_then_resume_is_bit_identical(tmp_path):
    steps = 6
    reward = write_files(tmp_path, delay=0.15)
    full = tmp_path / "full"
    finish(dew_process(grpo_config(tmp_path, full, reward, steps), tmp_path))
    run_dir = tmp_path / "killed"
    config = grpo_config(tmp_path, run_dir, reward, steps)
    proc = dew_process(config, tmp_path)
    ckpts = run_dir / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if ckpts.exists() and any(n.startswith("step_") for n in os.listdir(ckpts)):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = sorted(n for n in os.listdir(ckpts) if n.startswith("step_"))
    assert saved and saved[-1] < f"step_{steps:08d}"
    out = finish(dew_process(config, tmp_path))
    assert f"trained to step {steps} ({steps} updates)" in out
    resumed = records(run_dir)
    # the killed run's records, then the resumed run's from the batch after its checkpoint
    assert resumed[-1]["index"] == steps - 1 and resumed[-1]["lag"] == 1
    a, b = final_leaves(full), final_leaves(run_dir)
    assert len(a) == len(b) > 2
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and np.array_equal(x, y)


CHAIN = """output: chain
batch: 2
seed: 0
log_every: 1
model: {model}
optimizer: {{name: adam, learning_rate: 1e-2}}
stages:
  - {{name: grpo, steps: 3, reward: "{reward}:even", groups: 2, max_new_tokens: 6, eos_id: 0,
     behavior_importance: 2.0, rollout: {{mode: async, ahead: 1, truncation: score}},
     data: {{type: Prompts, path: prompts.jsonl, max_prompt_len: 4}}}}
"""


def test_chain_grpo_stage_async_runs_to_the_end(tmp_path, capsys):
    reward = write_files(tmp_path)
    config = tmp_path / "chain.yaml"
    config.write_text(CHAIN.format(model=json.dumps({**MODEL, "max_seq_len": 64}), reward=reward))
    assert main(["chain", str(config)]) == 0
    assert "grpo (grpo): step 3, 3 updates" in capsys.readouterr().out
    drawn = records(tmp_path / "chain" / "grpo")
    assert [r["lag"] for r in drawn] == [0, 1, 1]
    assert [r["version"] for r in drawn] == [0, 0, 1]

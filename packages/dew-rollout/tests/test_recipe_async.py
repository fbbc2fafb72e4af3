"""``rollout.mode: async`` through the command line: ``dew train grpo`` and a ``dew chain``
GRPO stage draw one batch ahead on the native engine, and a ``dew train grpo`` process killed
with SIGKILL after its first checkpoint resumes to the bit-identical final state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dew.cli import main
from dew.testing import checkpoint_arrays, wait_for_checkpoint

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
    # the reward of each trained batch, as rollout.jsonl has it, is in the step's metrics
    assert [m["reward/mean"] for m in metrics] == [r["reward/mean"] for r in drawn]
    saved = json.load(open(run_dir / "config.json"))
    assert saved["rollout"]["mode"] == "async" and saved["rollout"]["max_lag"] == 1


def test_train_grpo_async_adapts_its_correction_and_checkpoints_it(tmp_path, monkeypatch):
    """``behavior_importance_quantile``: the scheduler measures each batch's cap; it is logged
    (rollout.jsonl and metrics.jsonl) and its running estimate is in every checkpoint. The
    same run samples dynamically (the scheduler's admission draws uniform groups again)."""
    reward = write_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "adaptive"
    config = grpo_config(tmp_path, run_dir, reward, 3)
    raw = json.loads(config.read_text())
    raw["objective"].update(behavior_importance_quantile=0.9, behavior_importance_decay=0.5,
                            dynamic_sampling_groups=2, dynamic_sampling_draws=3)  # fmt: skip
    config.write_text(json.dumps(raw))
    raw["rollout"]["admit"] = 1
    refused = tmp_path / "refused.yaml"
    refused.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(refused)]) == 2  # admit is dynamic's
    assert not run_dir.exists()
    assert main(["train", "grpo", "--config", str(config)]) == 0
    for drawn in records(run_dir):
        assert drawn["admitted_groups"] == 2 and 1 <= drawn["sampling/draws"] <= 3
        assert 0 <= drawn["sampling/filled_groups"] <= 2
    assert all("sampling/informative_share" in json.loads(line)
               for line in open(run_dir / "metrics.jsonl"))  # fmt: skip
    caps = [r["correction/cap"] for r in records(run_dir)]
    measured = [r["correction/measured_cap"] for r in records(run_dir)]
    assert len(caps) == 3 and all(c >= 1.0 for c in caps)
    assert max(measured[1:]) > 1.0 + 1e-3  # one update behind: the ratios spread past 1
    assert caps[0] == measured[0]  # the first batch's own measurement, then halfway each time
    assert caps[1] == pytest.approx(0.5 * caps[0] + 0.5 * measured[1])
    logged = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["correction/cap"] for m in logged] == pytest.approx(caps)
    metas = sorted((run_dir / "checkpoints").glob("step_*/meta.json"))
    state = json.loads(metas[-1].read_text())["extra"]["rollout"]["correction"]
    assert state["cap"] == pytest.approx(caps[-1]) and state["floor"] is None


def test_train_ppo_async_draws_one_batch_ahead_and_trains_its_critic(tmp_path, monkeypatch,
                                                                     capsys):  # fmt: skip
    """PPO draws through the same scheduler: the engine serves the policy half, and each
    drawn batch gets the critic's values and GAE targets before the update."""
    import jax

    from dew.recipes.generate import load_model

    reward = write_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "ppo"
    config = grpo_config(tmp_path, run_dir, reward, 3)
    raw = json.loads(config.read_text())
    raw["objective"].update(gamma=1.0, lam=0.95)
    config.write_text(json.dumps(raw))
    assert main(["train", "ppo", "--config", str(config)]) == 0
    assert "trained to step 3 (3 updates)" in capsys.readouterr().out
    drawn = records(run_dir)
    assert [r["lag"] for r in drawn] == [0, 1, 1]
    assert [r["version"] for r in drawn] == [0, 0, 1]
    assert [r["pushed"] for r in drawn] == [-1, 1, 2]
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) and m["critic/loss"] > 0 for m in metrics)
    # each update's reward is the mean over the sessions the scheduler admitted for it
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in metrics)
    saved = json.load(open(run_dir / "config.json"))
    assert saved["kind"] == "ppo" and saved["rollout"]["mode"] == "async"
    policy = load_model(str(run_dir))  # the checkpoint's policy half, what the engine served
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(policy.variables))


def dew_process(config: Path, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                             str(config)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


STEPS = 6


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A run of ``STEPS`` steps left alone: its base folder, reward module and final arrays."""
    base = tmp_path_factory.mktemp("async_full")
    reward = write_files(base, delay=0.15)
    full = base / "full"
    finish(dew_process(grpo_config(base, full, reward, STEPS), base))
    return base, reward, checkpoint_arrays(full)


def interrupt_after_first_checkpoint(base: Path, config: Path, run_dir: Path, sig: int) -> str:
    """Start ``config``, send ``sig`` once its first checkpoint exists; its stderr."""
    proc = dew_process(config, base)
    ckpts = run_dir / "checkpoints"
    assert wait_for_checkpoint(proc, run_dir, 240), "the run ended before it could be stopped"
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), err[-3000:]
    saved = sorted(n for n in os.listdir(ckpts) if n.startswith("step_"))
    assert saved and saved[-1] < f"step_{STEPS:08d}"
    return err


def resume_and_compare(base: Path, config: Path, run_dir: Path, expected: list) -> None:
    out = finish(dew_process(config, base))
    assert f"trained to step {STEPS} ({STEPS} updates)" in out
    last = records(run_dir)[-1]
    assert last["index"] == STEPS - 1 and last["lag"] == 1
    got = checkpoint_arrays(run_dir)
    assert len(got) == len(expected) > 2
    for x, y in zip(expected, got):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_a_stopped_run_resumes_to_bit_identical_arrays(uninterrupted, sig):
    base, reward, expected = uninterrupted
    run_dir = base / f"stopped_{int(sig)}"
    config = grpo_config(base, run_dir, reward, STEPS)
    err = interrupt_after_first_checkpoint(base, config, run_dir, sig)
    if sig == signal.SIGINT:  # the engine, reward workers and journal closed: one line, no trace
        assert "Traceback" not in err and "dew: SIGINT: stopped after step" in err
    resume_and_compare(base, config, run_dir, expected)


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


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_chain_rl_stage_async_runs_to_the_end(tmp_path, capsys, kind):
    reward = write_files(tmp_path)
    config = tmp_path / "chain.yaml"
    config.write_text(CHAIN.format(model=json.dumps({**MODEL, "max_seq_len": 64}), reward=reward))
    overrides = [] if kind == "grpo" else ["--set", "stages.0.kind=ppo"]
    assert main(["chain", str(config), *overrides]) == 0
    assert f"grpo ({kind}): step 3, 3 updates" in capsys.readouterr().out
    drawn = records(tmp_path / "chain" / "grpo")
    assert [r["lag"] for r in drawn] == [0, 1, 1]
    assert [r["version"] for r in drawn] == [0, 0, 1]
    metrics = [json.loads(line) for line in open(tmp_path / "chain" / "grpo" / "metrics.jsonl")]
    assert all(np.isfinite(m["loss"]) for m in metrics)
    assert all(("critic/loss" in m) == (kind == "ppo") for m in metrics)
    assert all(m.get("critic/loss", 1.0) > 0 for m in metrics)

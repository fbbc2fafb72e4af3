"""``source: {kind: environment}`` with ``rollout.mode: async`` in ``dew train grpo`` (and
``ppo``): the
tool episodes are drawn by dew-rollout's ``RolloutScheduler`` on the native engine one batch
ahead of the update (a lag of one update in ``rollout.jsonl`` and in ``episodes.jsonl``), and
a process killed with SIGKILL after its first checkpoint resumes through its rollout journal
on the same episodes as a run left alone, its parameters equal up to the last bits (see the
resume test for why not to the bit)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_recipe_environment import (
    WORKER,
    dew_process,
    finish,
    grpo_config,
    kill_after_first_checkpoint,
    workers_alive,
)

from dew.cli import main
from dew.testing import checkpoint_arrays


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("async_env_worker") / "tool_worker.py"
    path.write_text(WORKER)
    return path


#: Truncated episodes are trained with their reward (0), so every step makes an update.
ASYNC = {"mode": "async", "ahead": 1, "truncation": "score", "engine": {"kind": "native"}}


def async_config(worker: Path, run_dir: Path, steps: int, **source) -> Path:
    """The synchronous test's config with ``rollout.mode: async`` and the behaviour
    correction a lag of one update needs."""
    path = grpo_config(worker, run_dir, steps, **source)
    raw = json.loads(path.read_text())
    raw["rollout"] = ASYNC
    # two episodes per task: fewer batch shapes for the engine to compile
    raw["objective"].update(behavior_importance=2.0, groups=2)
    path.write_text(json.dumps(raw))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


STEPS = 3
#: Each tool step sleeps this long, so a batch takes a moment to draw and the process can be
#: killed between two checkpoints; the episodes themselves do not depend on time.
SLOW = {"env": {"WORKER_SLEEP": "0.2"}}
#: What an episode line says about the episode (``step`` aside: a resumed run counts again).
FIELDS = ("index", "task", "sample", "status", "turns", "reward", "detail", "version", "lag")


@pytest.fixture(scope="module")
def uninterrupted(worker, tmp_path_factory) -> Path:
    """The run directory of an async run of ``STEPS`` steps left alone (through the CLI)."""
    run_dir = tmp_path_factory.mktemp("async_env") / "full"
    out = finish(dew_process(async_config(worker, run_dir, STEPS, **SLOW)))
    assert f"trained to step {STEPS} ({STEPS} updates)" in out
    return run_dir


def test_an_async_config_draws_episodes_one_batch_ahead(worker, uninterrupted) -> None:
    run_dir = uninterrupted
    drawn = lines(run_dir / "rollout.jsonl")
    # batch i was submitted before update i - 1: it trains one update behind its weights
    assert [r["index"] for r in drawn] == [0, 1, 2]
    assert [r["lag"] for r in drawn] == [0, 1, 1]
    assert [r["version"] for r in drawn] == [0, 0, 1]
    episodes = lines(run_dir / "episodes.jsonl")
    assert len(episodes) == STEPS * 2 * 2  # steps * tasks per batch * groups
    for r in drawn:
        batch = [e for e in episodes if e["index"] == r["index"]]
        assert len(batch) == 4 and {e["step"] for e in batch} == {r["step"]}
        assert {e["lag"] for e in batch} == {r["lag"]}
        assert {e["version"] for e in batch} == {r["version"]}
    assert {e["status"] for e in episodes} <= {"completed", "truncated"}
    completed = [e for e in episodes if e["status"] == "completed"]
    assert completed and all(e["turns"] == 2 and e["detail"] in ("0", "1") for e in completed)
    assert all(e["reward"] == float(e["detail"]) for e in completed)
    assert {e["task"] for e in episodes} <= set(range(6))
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) for m in metrics)
    assert (run_dir / "rollout-journal").is_dir() and not (run_dir / "journal").exists()
    assert workers_alive(worker) == []


def test_an_async_ppo_config_draws_episodes_ahead_and_trains_its_critic(worker, tmp_path):
    """PPO on the scheduler's episodes: the lag of one update, the critic's loss on every
    step, and the episodes' rewards behind each update's mean."""
    run_dir = tmp_path / "ppo"
    path = async_config(worker, run_dir, STEPS)
    raw = json.loads(path.read_text())
    raw["objective"].update(gamma=1.0, lam=0.95)
    path.write_text(json.dumps(raw))
    assert main(["train", "ppo", "--config", str(path)]) == 0
    assert [r["lag"] for r in lines(run_dir / "rollout.jsonl")] == [0, 1, 1]
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) and m["critic/loss"] > 0 for m in metrics)
    episodes = lines(run_dir / "episodes.jsonl")
    for m in metrics:
        rewards = [e["reward"] for e in episodes if e["step"] == m["step"]]
        assert len(rewards) == 4 and m["reward/mean"] == pytest.approx(np.mean(rewards))
    assert json.load(open(run_dir / "config.json"))["kind"] == "ppo"
    assert workers_alive(worker) == []


def episodes_by_sample(run_dir: Path) -> dict:
    """The episodes each batch trained on, keyed by (index, task, sample); a batch written
    twice (killed, then redrawn) keeps its last lines."""
    return {(e["index"], e["task"], e["sample"]): {k: e[k] for k in FIELDS}
            for e in lines(run_dir / "episodes.jsonl")}  # fmt: skip


@pytest.mark.slow
def test_a_killed_async_run_resumes_on_the_same_episodes(worker, uninterrupted, tmp_path):
    """The resumed run redraws the batches in flight under the weights they were submitted
    with: it trains on the same episodes, at the same versions, as the run left alone, and
    ends at the same step and update count. Its floats agree closely, not to the bit: the
    native engine batches turns as they arrive, and the batch shapes (thread timing) change
    the last bits of the engine's log-probabilities, so two uninterrupted runs differ there
    too."""
    expected = checkpoint_arrays(uninterrupted)
    run_dir = tmp_path / "killed"
    config = async_config(worker, run_dir, STEPS, **SLOW)
    kill_after_first_checkpoint(dew_process(config), run_dir, worker, STEPS)

    out = finish(dew_process(config))
    assert f"trained to step {STEPS} ({STEPS} updates)" in out
    assert episodes_by_sample(run_dir) == episodes_by_sample(uninterrupted)
    last = lines(run_dir / "rollout.jsonl")[-1]
    assert last["index"] == STEPS - 1 and last["lag"] == 1
    got = checkpoint_arrays(run_dir)
    assert len(got) == len(expected) > 2
    for x, y in zip(expected, got):
        assert x.dtype == y.dtype and x.shape == y.shape
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-4)
        else:  # step, updates, RNG keys
            assert np.array_equal(x, y)
    assert workers_alive(worker) == []

"""examples/tool_episodes/chain.yaml learns: ``dew chain`` runs its warm-up and GRPO stages as
written, and the held-out success rate (sampled episodes on task ids never trained on, against
the same worker) rises by more than twice its standard error; so does the PPO stage (with a
critic) its comment describes, made by ``--set`` from the same file."""

from __future__ import annotations

import functools
import json
import math
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tool_episodes"
HELD_OUT = list(range(1000, 1256))  # the config trains on task ids 0..999


#: The PPO stage of the config's comment: the output and the stage renamed, gamma and lam.
PPO = ["output=runs-ppo", "stages.1.name=ppo", "stages.1.kind=ppo", "stages.1.gamma=1.0",
       "stages.1.lam=0.95"]  # fmt: skip


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> pathlib.Path:
    """The example copied to a fresh directory, with its data made."""
    work = tmp_path_factory.mktemp("tool_episodes")
    for name in ("chain.yaml", "square_tool.py", "make_data.py"):
        shutil.copy(EXAMPLE / name, work / name)
    assert load_script(work / "make_data.py").main([str(work / "data")]) == 0
    return work


@pytest.fixture(scope="module")
def chain_run(example) -> pathlib.Path:
    """The chain run as written: ``runs/warmup`` and ``runs/grpo``."""
    assert main(["chain", str(example / "chain.yaml")]) == 0
    return example


@functools.cache
def success(work: pathlib.Path, stage: str) -> tuple[float, float]:
    """The mean reward and its standard error over one sampled episode per held-out task,
    with the policy of ``stage`` and the example's own worker and budgets."""
    from dew.inference import TextGeneration
    from dew.objectives.rl import EpisodeRollout
    from dew.recipes.environment_run import outcome_reward
    from dew.recipes.generate import load_model
    from dew.sampling import Sampling
    from dew.sandbox.episode_recipe import subprocess_environment

    loaded = load_model(str(work / stage))
    # as many workers at once as a training step of the config starts (batch 8 x groups 8)
    worker = subprocess_environment({"command": [sys.executable, str(work / "square_tool.py")],
                                     "limits": {"deadline_seconds": 300}})  # fmt: skip
    rollout = EpisodeRollout(TextGeneration(loaded.model), worker, outcome_reward, 8, 3, 2, 1,
                             Sampling(temperature=1.0, eos_id=1))  # fmt: skip
    rewards = np.asarray([e.reward for start in range(0, len(HELD_OUT), 64) for e in
                          rollout.collect(loaded.variables, HELD_OUT[start : start + 64],
                                          jax.random.key(start))], np.float64)  # fmt: skip
    return float(rewards.mean()), float(rewards.std(ddof=1) / math.sqrt(len(rewards)))


def test_the_warm_up_teaches_the_protocol_not_the_answer(chain_run) -> None:
    before, _ = success(chain_run, "runs/warmup")
    assert before <= 0.25, before  # about one right digit in ten
    episodes = [json.loads(line) for line in open(chain_run / "runs" / "grpo" / "episodes.jsonl")]
    completed = [e for e in episodes if e["status"] == "completed"]
    assert len(completed) >= 0.9 * len(episodes)  # the policy calls, answers and stops
    assert all(e["turns"] == 2 for e in completed if e["reward"] == 1.0)


def test_grpo_lifts_held_out_success_beyond_its_standard_error(chain_run) -> None:
    before, se_before = success(chain_run, "runs/warmup")
    after, se_after = success(chain_run, "runs/grpo")
    assert after - before > 2 * math.hypot(se_before, se_after), (before, after)


def test_the_ppo_stage_with_a_critic_lifts_held_out_success_too(example, capsys) -> None:
    overrides = [part for assignment in PPO for part in ("--set", assignment)]
    assert main(["chain", str(example / "chain.yaml"), *overrides]) == 0
    assert "ppo (ppo): step 10, 10 updates" in capsys.readouterr().out
    metrics = [json.loads(line) for line in open(example / "runs-ppo" / "ppo" / "metrics.jsonl")]
    assert all(m["critic/loss"] > 0 for m in metrics)  # the critic trained alongside
    before, se_before = success(example, "runs-ppo/warmup")
    after, se_after = success(example, "runs-ppo/ppo")
    assert after - before > 2 * math.hypot(se_before, se_after), (before, after)

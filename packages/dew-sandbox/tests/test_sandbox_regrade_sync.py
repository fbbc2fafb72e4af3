"""Re-grading in the trainer's own collection: ``EpisodeRollout(regrade=SandboxRegrader)``.

The same fooled worker as ``test_sandbox_regrade`` (``answer_worker.py``, real subprocesses):
a planted ``expected.txt`` earns 1.0 in the environment and 0.0 where only ``answer.txt``
travels. In the synchronous rollout a rejected episode becomes ERROR with no reward, so its
tokens leave the packed batch (no mask, no advantage) while the batch keeps its shape, and
the counts reach ``last_metrics``, which the Trainer adds to each log record. A config run
with ``rollout.mode: sync`` shows the same through ``dew train grpo``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import jax
import numpy as np
import pytest
from test_sandbox_regrade import EOS, LIMITS, PLANT, SAY, WORKER, digits, regrader

from dew.objectives.rl import EpisodeRollout
from dew.sampling import Sampling
from dew.sandbox import ProcessRunner, SandboxFleet, SubprocessEnvironment


@dataclass
class Generation:
    ids: np.ndarray
    raw_log_probs: np.ndarray
    behavior_log_probs: np.ndarray
    eos: bool


class TwoMinds:
    """A scripted policy over two samples per task: sample 0 of task 4 plants a wrong answer
    (7) and its expected file, sample 1 answers it wrongly (7) without planting; every sample
    of task 3 answers honestly (9)."""

    def bind(self, snapshot):
        return self

    def __call__(self, contexts, budgets, key, sampling):
        out = []
        for position, (context, budget) in enumerate(zip(contexts, budgets)):
            task = int(context[1]) - 4 if len(context) > 1 else None
            if task == 4:
                ids = [PLANT if position % 2 == 0 else SAY, *digits(7), EOS]
            else:
                ids = [SAY, *digits(9), EOS]
            ids = ids[:budget]
            n = len(ids)
            out.append(Generation(np.asarray(ids, np.int32), np.full(n, -0.5, np.float32),
                                  np.full(n, -0.5, np.float32), ids[-1] == EOS))  # fmt: skip
        return out


def collect(regrade=None):
    rollout = EpisodeRollout(TwoMinds(), SubprocessEnvironment([sys.executable, str(WORKER)], LIMITS),
                             lambda episode: float(episode.detail), 8, 6, 2, 2,
                             Sampling(eos_id=EOS), regrade=regrade)  # fmt: skip
    batch = rollout({"params": {}}, {"task_id": np.array([3, 4])}, jax.random.key(0))
    return rollout, batch


PLANTED = 2  # task 4, sample 0: the third episode of the collection


def trained(batch, index):
    """How many of episode ``index``'s tokens train, and their advantages."""
    tokens = (batch["session_index"] == index) & (batch["response_mask"] > 0)
    return int(tokens.sum()), batch["advantages"][tokens]


def test_sync_rollout_trains_the_exploit_without_regrade():
    rollout, batch = collect()
    planted = rollout.last_episodes[PLANTED]
    assert planted.id.task == 4 and planted.reward == 1.0 and str(planted.status) == "completed"
    count, advantages = trained(batch, PLANTED)
    assert count > 0 and (advantages > 0).all()  # the exploit is pushed up
    assert rollout.last_metrics == {}


def test_sync_rollout_masks_a_rejected_episode_and_counts_it():
    with SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2) as fleet:
        rollout, batch = collect(regrader(fleet))
    _, plain = collect()
    planted = rollout.last_episodes[PLANTED]
    assert str(planted.status) == "error" and planted.reward is None
    assert planted.detail == "regrade rejected: in-environment reward 1.0, clean sandbox 0.0"
    assert trained(batch, PLANTED)[0] == 0  # no token of it trains
    assert {k: v.shape for k, v in batch.items()} == {k: v.shape for k, v in plain.items()}
    honest = [e for i, e in enumerate(rollout.last_episodes) if i != PLANTED]
    assert [e.reward for e in honest] == [1.0, 1.0, 0.0]  # the others agreed, kept
    assert all(str(e.status) == "completed" for e in honest)
    assert rollout.last_metrics == {"regrade/regraded": 4.0, "regrade/agreed": 3.0,
                                    "regrade/rejected": 1.0, "regrade/failed": 0.0}  # fmt: skip


#: The clean verifier of the config run: it disagrees with every episode.
DISAGREE = "import json, sys\njson.load(sys.stdin)\nprint(-1)\n"


def test_a_sync_config_regrades_and_never_trains_a_rejected_episode(tmp_path, capsys):
    from test_recipe_environment import WORKER as TOOL
    from test_recipe_environment import grpo_config

    from dew.cli import main

    worker = tmp_path / "tool_worker.py"
    worker.write_text(TOOL)
    (tmp_path / "verify.py").write_text(DISAGREE)
    regrade = {"command": ["python3", "verify.py"], "files": ["missing.txt"],
               "inputs": {"verify.py": "verify.py"}}  # fmt: skip
    run_dir = tmp_path / "run"
    config = grpo_config(worker, run_dir, 2, regrade=regrade)
    raw = json.loads(config.read_text())
    raw["rollout"] = {"mode": "sync"}
    config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 0
    assert "trained to step 2" in capsys.readouterr().out
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    rejected = [e for e in episodes if e["detail"].startswith("regrade rejected:")]
    assert rejected and all(e["status"] == "error" and e["reward"] is None for e in rejected)
    assert all(e["detail"].endswith("clean sandbox -1.0") for e in rejected)
    assert not [e for e in episodes if e["status"] == "completed"]  # none trains
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    last = [r for r in records if "regrade/rejected" in r][-1]
    assert last["regrade/rejected"] == last["regrade/regraded"] == len(rejected)
    assert last["regrade/agreed"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_both_modes_accept_the_key(mode):
    from dew.recipes.source_config import source_section

    raw = {"source": {"kind": "environment", "command": [sys.executable], "tasks": 2,
                      "regrade": {"command": ["python3"], "files": ["a"]}},
           "objective": {"eos_id": 1}, "rollout": {"mode": mode}}  # fmt: skip
    assert source_section(raw, "grpo").regrade == {"command": ["python3"], "files": ["a"]}

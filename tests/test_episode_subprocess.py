"""A full EpisodeRollout cohort against real SubprocessEnvironment workers, trained one GRPO
step by the Trainer; and a worker crash aborting the cohort with no worker left alive."""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np
import optax
import pytest

from dew.data.dataset import Dataset
from dew.inference import TextGeneration
from dew.objectives.rl import EpisodeFailure, EpisodeRollout
from dew.objectives.rl.grpo import GRPOObjective
from dew.rollouts.episodes import EpisodeStatus
from dew.sampling import Sampling
from dew.sandbox import SandboxLimits, SubprocessEnvironment
from dew.sandbox.subprocess_environment import WorkerCrashed
from dew.testing import tiny_decoder
from dew.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "packages" / "dew-sandbox" / "tests" / "square_worker.py")
EOS, CALL, SAY = 1, 2, 3
P, R, K, G = 8, 4, 3, 2
# several EOS ids so that an untrained decoder finishes most turns
SAMPLING = Sampling(eos_id=(EOS, CALL, SAY, 4, 5), temperature=1.0)
LIMITS = SandboxLimits(cpu_seconds=10, deadline_seconds=60)


def verifier(episode):
    x = episode.id.task % 10
    return 1.0 if episode.detail == str(x * x) else 0.0


class Tracking:
    """Wraps the factory to remember every worker pid it started."""

    def __init__(self, factory):
        self.factory = factory
        self.sessions = []

    def __call__(self, episode_id):
        session = self.factory(episode_id)
        self.sessions.append(session)
        return session

    def alive(self):
        return [s for s in self.sessions if s.process is not None]


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(16, 32, init_std=0.02)


def test_a_subprocess_cohort_trains_one_grpo_step(model, tmp_path):
    audit = tmp_path / "audit.jsonl"
    factory = Tracking(
        SubprocessEnvironment([sys.executable, WORKER], LIMITS, env={"WORKER_AUDIT": str(audit)})
    )
    rollout = EpisodeRollout(TextGeneration(model), factory, verifier, P, R, K, G, SAMPLING)
    objective = GRPOObjective(model, seq_len=P + R - 1)
    seen = {}

    def hook(variables, batch, key):
        seen["batch"] = rollout(variables, batch, key)
        return seen["batch"]

    hook.at_step = rollout.at_step
    data = Dataset(train=lambda part: iter([{"task_id": np.arange(4)}] * 2), batch=4)
    trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(2), rollout=hook)
    state = trainer.fit(data, steps=1)
    episodes = rollout.last_episodes
    assert len(factory.sessions) == 4 * G and factory.alive() == []
    assert {e.status for e in episodes} <= {EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED}
    assert any(e.status is EpisodeStatus.COMPLETED for e in episodes)
    batch = seen["batch"]
    assert batch["input_ids"].shape == (4 * G * K, P + R)
    trained = [e for e in episodes if e.status is EpisodeStatus.COMPLETED]
    assert int(batch["response_mask"].sum()) == sum(
        a.tokens.size for e in trained for a in e.actions
    )
    sent = [a for e in episodes for a in e.actions if a.terminated]
    audited = audit.read_text().splitlines() if audit.exists() else []
    assert sent and len(audited) == len(sent)  # every turn that reached the tool ran once
    assert int(state.step) == 1


def test_a_worker_crash_aborts_the_cohort_and_leaves_no_worker(model):
    factory = Tracking(
        SubprocessEnvironment([sys.executable, WORKER], LIMITS, env={"WORKER_MODE": "crash"})
    )
    rollout = EpisodeRollout(TextGeneration(model), factory, verifier, P, R, K, G, SAMPLING)
    variables = GRPOObjective(model, seq_len=P + R - 1).init(jax.random.key(0))
    with pytest.raises(EpisodeFailure, match="aborted by WorkerCrashed") as caught:
        rollout(variables, {"task_id": np.arange(4)}, jax.random.key(2))
    assert isinstance(caught.value.__cause__, WorkerCrashed)
    assert caught.value.episode.status is EpisodeStatus.ERROR
    assert factory.alive() == []

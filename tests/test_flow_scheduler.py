"""Flow-GRPO on the asynchronous stack: ``FlowSource`` sessions run by ``RolloutScheduler``
and packed by ``FlowPacker``: the batch layout, redraws from a seed, rescoring, the Trainer one
batch ahead with pushes and an adaptive correction, the staleness bound, a failing reward and
the refusals. Threads and the trainer are real; the model is a tiny DiT on 4x4 images."""

from __future__ import annotations

import flax
import jax
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.data import Dataset
from dew.data.dataset import Partition
from dew.flow import (
    Field,
    FlowGRPOObjective,
    FlowPacker,
    FlowSource,
    InputSpec,
    LabelEncoder,
    RewardError,
    SimpleDiT,
    group_advantages,
    presets,
)
from dew.rollout import RolloutScheduler
from dew.rollouts.correction_caps import AdaptiveCorrection
from dew.sessions.records import Session

INPUTS = InputSpec(Field("image", (4, 4, 1)), Field("label", (), "int32"))
DIT = SimpleDiT(output_channels=1, patch_size=2, emb_features=8, num_layers=1, num_heads=2,
                mlp_ratio=2)  # fmt: skip
ENCODERS = {"label": LabelEncoder(num_classes=2, features=4)}
B, G, STEPS, KEPT = 2, 4, 5, 3


def mixed_reward(images, fields):
    """Label 0 always scores 1.0 (a group without signal); label 1 scores its brightness."""
    bright = images.mean(axis=(1, 2, 3)).astype(np.float64) + 1e-9
    return np.where(fields["label"] == 0, 1.0, bright)


def moved(objective):
    variables = objective.init(jax.random.key(0))
    flat = flax.traverse_util.flatten_dict(variables["params"])
    rng = np.random.default_rng(1)
    flat = {k: (v + rng.normal(0, 0.2, v.shape)).astype(np.float32) for k, v in flat.items()}
    return {"params": flax.traverse_util.unflatten_dict(flat)}


def make_objective(variables=None, **options):
    return FlowGRPOObjective(DIT, presets.Flow()(), INPUTS, steps=STEPS, encoders=ENCODERS,
                             pretrained=variables, **options)  # fmt: skip


@pytest.fixture(scope="module")
def setup():
    objective = make_objective()
    return objective, moved(objective)


def label_batches(count):
    return [{"label": np.array([0, 1], np.int32)} for _ in range(count)]


def dataset_of(batches):
    return Dataset(train=lambda partition, start=0: iter(batches[start:]), batch=B)


def scheduler_for(objective, variables, reward=mixed_reward, **options):
    source = FlowSource(objective, reward, variables, train_steps=KEPT)
    records = []
    options = {"ahead": 0, "max_lag": 0, **options}
    scheduler = RolloutScheduler(objective, source, source, tasks=source.tasks, groups=G,
                                 packer=FlowPacker(objective, rows=B * G),
                                 log=records.append, **options)  # fmt: skip
    return scheduler, source, records


def drive(scheduler, batches, variables, updates=None):
    stream = scheduler.tasks(dataset_of(batches)).stream(Partition(), 0)
    outs = []
    for step in range(1, len(batches) + 1):
        scheduler.at_step(step, step - 1 if updates is None else updates[step - 1])
        outs.append(scheduler(variables, dict(next(stream)), None))
    return outs


def test_a_packed_flow_batch(setup):
    objective, variables = setup
    scheduler, source, records = scheduler_for(objective, variables)
    (out,) = drive(scheduler, label_batches(1), variables)
    sessions = scheduler.last_sessions
    scheduler.close()
    source.close()
    n = B * G
    np.testing.assert_array_equal(out["label"], [0, 0, 0, 0, 1, 1, 1, 1])  # contiguous groups
    assert out["states"].shape == (n, KEPT, 4, 4, 1) and out["advantages"].shape == (n, KEPT)
    rewards = np.array([s.reward for s in sessions])
    np.testing.assert_array_equal(out["rewards"], rewards)
    want = group_advantages(rewards, G).astype(np.float32)
    np.testing.assert_array_equal(out["advantages"][:, 0], want)
    # the uniform group stays in the batch, masked; the other trains every kept transition
    np.testing.assert_array_equal(out["transition_mask"][:G], 0.0)
    np.testing.assert_array_equal(out["transition_mask"][G:], 1.0)
    np.testing.assert_allclose(out["times"][0], np.asarray(objective.process.grid(STEPS))[:KEPT])
    np.testing.assert_array_equal(out["states"][:, 1:], out["next_states"][:, :-1])
    # drawn and rescored under the same weights: the proximal policy is the behavior one
    np.testing.assert_allclose(out["old_log_probs"], out["behavior_log_probs"], atol=1e-5)
    (record,) = records
    assert record.version == 0 and record.lag == 0 and record.admitted_groups == B
    assert record.metrics["reward/mean"] == pytest.approx(rewards.mean())
    assert record.metrics["staleness/gap"] < 1e-5
    # the sample is a function of the seed it was submitted with: a redraw is the same draw
    again = FlowSource(objective, mixed_reward, variables, train_steps=KEPT)
    task = source.tasks({"label": np.array([0, 1], np.int32)})[1]
    first, second = (again.submit(task, seed=123).result() for _ in range(2))
    other = again.submit(task, seed=124).result()
    again.close()
    np.testing.assert_array_equal(first.payload["states"], second.payload["states"])
    assert first.reward == second.reward and first.version == 0
    assert not np.array_equal(first.payload["states"], other.payload["states"])


def test_trainer_one_batch_ahead_with_pushes_and_an_adaptive_correction(setup):
    _, start = setup
    objective = make_objective(start, behavior_importance=2.0)
    correction = AdaptiveCorrection(0.9, decay=0.5)
    scheduler, source, records = scheduler_for(objective, start, ahead=1, max_lag=1,
                                               correction=correction)  # fmt: skip
    seen = []

    class Seen:
        """The scheduler as the Trainer's rollout, keeping each batch it returned."""

        def at_step(self, step, updates):
            scheduler.at_step(step, updates)

        def __call__(self, variables, batch, key):
            seen.append(scheduler(variables, batch, key))
            return seen[-1]

    trainer = Trainer(objective, optax.adam(3e-2), key=jax.random.key(1), rollout=Seen(),
                      progress=False)  # fmt: skip
    state = trainer.fit(scheduler.tasks(dataset_of(label_batches(4))), steps=4,
                        state=trainer.initial_state())  # fmt: skip
    scheduler.close()
    source.close()
    after = jax.tree.leaves(jax.device_get(state.params))
    assert any(not np.array_equal(a, b) for a, b in zip(after, jax.tree.leaves(start["params"])))
    # batch i was drawn after i - 1 updates and trained after i: a lag of one from batch 1 on
    assert [r.updates for r in records] == [0, 1, 2, 3]
    assert [r.pushed for r in records] == [None, 1, 2, 3]
    assert [r.version for r in records] == [0, 0, 1, 2]
    assert [r.lag for r in records] == [0, 1, 1, 1]
    # the rescored proximal policy is one update newer than the draws
    gaps = [r.metrics["staleness/gap"] for r in records]
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-4, gaps
    # each batch carries the cap measured from its own transitions' ratios
    keep = seen[1]["transition_mask"] > 0
    ratios = np.exp(seen[1]["old_log_probs"] - seen[1]["behavior_log_probs"])[keep]
    measured = max(1.0, float(np.quantile(ratios.astype(np.float64), 0.9)))
    assert records[1].metrics["correction/measured_cap"] == pytest.approx(measured, rel=1e-5)
    assert seen[1]["behavior_cap"].shape == (B * G,)
    assert {s.version for s in scheduler.last_sessions} == {2}


def test_stale_flow_samples_are_drawn_again_on_fresh_weights(setup):
    objective = make_objective(behavior_importance=2.0)
    variables = setup[1]
    scheduler, source, records = scheduler_for(objective, variables, ahead=1, max_lag=1)
    drive(scheduler, label_batches(2), variables, updates=[0, 3])
    sessions = scheduler.last_sessions
    scheduler.close()
    source.close()
    first, second = records
    # batch 1 was submitted under version 0; three updates later it is past max_lag=1
    assert second.pushed is None and source.version == 3
    assert second.resubmitted == {"stale": B * G}
    assert second.version == 3 and second.lag == 0
    assert {s.version for s in sessions} == {3}


def test_a_failing_reward_reaches_the_trainer(setup):
    objective, variables = setup

    def broken(images, fields):
        raise OSError("scorer down")

    scheduler, source, _ = scheduler_for(objective, variables, reward=broken)
    with pytest.raises(RewardError, match="reward: raised OSError: scorer down"):
        drive(scheduler, label_batches(1), variables)
    scheduler.close()
    source.close()
    short, _, _ = scheduler_for(objective, variables, reward=lambda images, fields: [1.0, 2.0])
    with pytest.raises(RewardError, match=r"one score per sample, shape \[1\], got \[2\]"):
        drive(short, label_batches(1), variables)
    short.close()
    short.source.close()


def test_refusals(setup):
    objective, variables = setup
    source = FlowSource(objective, mixed_reward, variables)
    packer = FlowPacker(objective, rows=B * G)
    with pytest.raises(ValueError, match="width: the packer sets the batch's shape"):
        RolloutScheduler(objective, source, source, tasks=source.tasks, groups=G,
                         packer=packer, width=8, max_lag=0, ahead=0)  # fmt: skip
    with pytest.raises(
        TypeError, match=r"packer: expected a packer \(TokenPacker, FlowPacker\), it has no rows"
    ):
        RolloutScheduler(objective, source, source, tasks=source.tasks, groups=G,
                         packer=object(), max_lag=0, ahead=0)  # fmt: skip
    with pytest.raises(ValueError, match="rows: expected an integer >= 1"):
        FlowPacker(objective, rows=0)
    with pytest.raises(ValueError, match="train_steps: expected at most the 4 stochastic"):
        FlowSource(objective, mixed_reward, variables, train_steps=5)
    bare = [Session(task=0, group=0, reward=1.0, version=0), Session(task=0, group=0, reward=0.0)]
    with pytest.raises(TypeError, match="task 0 sample 0 has no flow payload"):
        packer.pack(bare, [], 0)
    lone = [Session(task=0, group=g, reward=1.0, payload={"states": 0}) for g in range(2)]
    with pytest.raises(ValueError, match=r"one size >= 2 .* got group sizes \[1, 1\]"):
        packer.pack(lone, [], 0)
    with pytest.raises(ValueError, match="no group of the batch completed"):
        packer.pack([], [], 0)
    with pytest.raises(ValueError, match="Session.version: expected None or a nonnegative"):
        Session(task=0, version=-1)
    source.close()
    with pytest.raises(RuntimeError, match="FlowSource: closed"):
        source.submit(source.tasks({"label": np.array([0], np.int32)})[0], seed=0)

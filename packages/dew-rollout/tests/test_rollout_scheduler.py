"""RolloutScheduler: admission by status, retries, truncation modes, stragglers (timeouts,
oversampling, admit), the staleness bound, cut groups, pushes, refusals and a Trainer run on
the native server through prompts and through multi-turn environments. Threads are real; a
scripted SessionSource (rollout_scripted.py) forces the statuses a real engine will not."""

from __future__ import annotations

import re
import sys

import jax
import numpy as np
import optax
import pytest
from rollout_scripted import Plan, Scripted
from rollout_tiny import WIDTH

from dew import Trainer
from dew.data import Dataset
from dew.data.dataset import Partition
from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rl.sessions import Status
from dew.rollout import (
    EnvironmentSource,
    NativeRolloutServer,
    PromptSource,
    Publication,
    RolloutScheduler,
    SchedulerRecord,
    prompt_tasks,
    task_ids,
)
from dew.rollouts.dynamic_sampling import DynamicSampling
from dew.testing import TerminalStream as Terminal

B, G = 2, 2


@pytest.fixture(scope="module")
def objective(tiny):
    return GRPOObjective(tiny.model, seq_len=WIDTH - 1, behavior_importance=2.0)


def id_batches(count, tasks=B):
    return [{"task_id": np.arange(tasks, dtype=np.int32) + 10 * i} for i in range(count)]


def dataset_of(batches):
    def train(partition, start=0):
        return iter(batches[start:])

    return Dataset(train=train, batch=len(next(iter(batches[0].values()))))


class Pushes:
    """A Publication over a push that only records the versions it was asked for."""

    def __init__(self):
        self.versions = []
        self.publication = Publication(lambda variables, version: self.versions.append(version))


def scheduler_for(objective, script, *, weights=None, **options):
    pushes = Pushes()
    weights = weights if weights is not None else pushes.publication
    source = Scripted(script, weights)
    records = []
    options = {"width": WIDTH, "rows": B * G, "tasks": task_ids, "groups": G, **options}
    scheduler = RolloutScheduler(objective, source, weights, log=records.append, **options)
    return scheduler, source, records, pushes


def drive(scheduler, batches, variables, updates=None, steps=None):
    """What the Trainer does each step: take a batch, tell the clock, call the rollout."""
    stream = scheduler.tasks(dataset_of(batches)).stream(Partition(), 0)
    outs = []
    for step in range(1, (steps or len(batches)) + 1):
        batch = next(stream)
        scheduler.at_step(step, step - 1 if updates is None else updates[step - 1])
        outs.append(scheduler(variables, dict(batch), None))
    return outs


def labels(scheduler):
    return sorted((s.task, s.group, s.sample, s.attempt) for s in scheduler.last_sessions)


# ---------------------------------------------------------------- admission by status


def test_statuses_retries_and_relabelling(tiny, objective):
    plans = {
        (0, 0): Plan(Status.INFRA_ERROR, None),
        (0, 1): Plan(Status.CANCELLED, None),
        (1, 0): Plan(Status.AGENT_ERROR, 0.0),
        (1, 1): Plan(Status.TRUNCATED, 0.5),
    }
    scheduler, source, records, _ = scheduler_for(
        objective, lambda task, n: plans.get((task, n), Plan(reward=float(n))), ahead=0
    )
    (out,) = drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    assert isinstance(record, SchedulerRecord)
    assert record.resubmitted == {"infra_error": 1, "cancelled": 1}
    assert record.admitted_groups == 2 and record.abandoned == 0 and record.cut == 0
    # the retries rejoined their group as attempt 1 of the same sample
    assert labels(scheduler) == [(0, 0, 0, 1), (0, 0, 1, 1), (1, 1, 0, 0), (1, 1, 1, 0)]
    rewards = {(s.task, s.sample): s.reward for s in scheduler.last_sessions}
    assert rewards == {(0, 0): 2.0, (0, 1): 3.0, (1, 0): 0.0, (1, 1): 0.5}
    # "mask": the truncated session takes no loss; the agent error trains on its reward
    sessions = out["session_index"]
    truncated = [i for i, s in enumerate(scheduler.last_sessions) if s.status is Status.TRUNCATED]
    assert out["response_mask"][sessions == truncated[0]].sum() == 0
    assert out["response_mask"].sum() == 3 * 2
    assert out["input_ids"].shape == (B * G, WIDTH) and out["old_log_probs"].shape == (4, WIDTH)
    assert record.metrics["sessions/count"] == 4.0 and "latency/p99" in record.metrics
    # seeds differ per attempt and are fixed by batch, group, sample and attempt
    seeds = [seed for _, _, seed in source.submitted]
    assert len(set(seeds)) == len(seeds)


def test_max_attempts_abandons_the_group(tiny, objective):
    script = lambda task, n: Plan(Status.INFRA_ERROR, None) if task == 1 else Plan()  # noqa: E731
    scheduler, source, records, _ = scheduler_for(objective, script, ahead=0, max_attempts=3)
    (out,) = drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    assert record.abandoned == 1 and record.admitted_groups == 1
    # the group stops when one sample has failed 3 times; the other's attempt is cancelled
    failures = [n for task, n, _ in source.submitted if task == 1]
    assert 4 <= len(failures) <= 6 and record.resubmitted == {"infra_error": len(failures) - 2}
    assert record.cancelled == 1
    assert {s.task for s in scheduler.last_sessions} == {0}
    assert out["response_mask"].sum() == 2 * 2


@pytest.mark.parametrize("truncation", ["mask", "score", "zero"])
def test_truncation_modes(tiny, objective, truncation):
    def script(task, n):
        if n == 0:
            return Plan(Status.TRUNCATED, None if truncation == "score" else 0.9)
        return Plan(reward=1.0 if n == 1 else 0.0)

    scheduler, _, records, _ = scheduler_for(objective, script, ahead=0, truncation=truncation)
    (out,) = drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    statuses = sorted(s.status.value for s in scheduler.last_sessions)
    if truncation == "score":
        # a truncation without a reward is a failed attempt, submitted again
        assert record.resubmitted == {"truncated_unscored": 2} and "truncated" not in statuses
        assert out["response_mask"].sum() == 4 * 2
    else:
        assert record.resubmitted == {} and statuses.count("truncated") == 2
        trained = 4 * 2 if truncation == "zero" else 2 * 2
        assert out["response_mask"].sum() == trained
    if truncation == "zero":
        # reward 0 for the truncation against 1.0: a negative advantage
        sessions = out["session_index"]
        first = [i for i, s in enumerate(scheduler.last_sessions) if s.sample == 0][0]
        assert (out["advantages"][sessions == first] < 0).all()


# ---------------------------------------------------------------- stragglers and staleness


def test_timeout_cancels_and_resubmits(tiny, objective):
    script = lambda task, n: Plan(delay=60.0) if (task, n) == (0, 0) else Plan()  # noqa: E731
    scheduler, source, records, _ = scheduler_for(objective, script, ahead=0, timeout=0.5)
    drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    assert record.resubmitted == {"timeout": 1} and record.cancelled == 1
    assert source.cancelled == [(0, 0)]
    assert (0, 0, 0, 1) in labels(scheduler)


def test_oversample_admits_the_first_to_finish(tiny, objective):
    delays = {0: 30.0, 1: 0.0, 2: 30.0, 3: 0.0}
    scheduler, source, records, _ = scheduler_for(
        objective, lambda task, n: Plan(delay=delays[n]), ahead=0, oversample=2
    )
    drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    assert record.admitted_groups == 2 and record.cancelled == 4
    assert {s.sample for s in scheduler.last_sessions} == {1, 3}
    assert sorted(source.cancelled) == [(0, 0), (0, 2), (1, 0), (1, 2)]


def test_admit_takes_the_first_groups_and_cancels_the_rest(tiny, objective):
    script = lambda task, n: Plan(delay=30.0 if task == 1 else 0.0)  # noqa: E731
    scheduler, source, records, _ = scheduler_for(objective, script, ahead=0, admit=2, rows=3 * G)
    drive(scheduler, id_batches(1, tasks=3), tiny.variables)
    (record,) = records
    assert record.admitted_groups == 2 and record.groups == 3 and record.cancelled == 2
    assert {s.task for s in scheduler.last_sessions} == {0, 2}
    assert sorted(source.cancelled) == [(1, 0), (1, 1)]


def test_dynamic_sampling_draws_uniform_groups_again_and_admits_those_with_signal(tiny, objective):
    # task 0 scores [1, 1] then [0, 1]: drawn twice; task 1 is uniform and slow; task 2 differs
    def script(task, n):
        if task == 1:
            return Plan(reward=1.0, delay=0.5)
        return Plan(reward=1.0 if task == 0 and n < 2 else float(n % 2))

    sampling = DynamicSampling(groups=2, max_draws=3)
    scheduler, source, records, _ = scheduler_for(
        objective, script, ahead=0, dynamic_sampling=sampling
    )
    drive(scheduler, id_batches(1, tasks=3), tiny.variables)
    (record,) = records
    assert record.admitted_groups == 2 and record.groups == 3
    assert labels(scheduler) == [(0, 0, 0, 1), (0, 0, 1, 1), (2, 2, 0, 0), (2, 2, 1, 0)]
    seeds = [seed for task, _, seed in source.submitted if task == 0]
    assert len(seeds) == 4 and len(set(seeds)) == 4  # the second round draws afresh
    assert record.metrics["sampling/filled_groups"] == 0.0
    assert record.metrics["sampling/draws"] >= 2.0
    assert scheduler.last_metrics["sampling/filled_groups"] == 0.0
    assert sorted(source.cancelled) == [(1, 0), (1, 1)]  # the slow uniform group: dropped


def test_dynamic_sampling_fills_with_a_uniform_group_at_its_last_round(tiny, objective):
    script = lambda task, n: Plan(reward=1.0 if task == 1 else float(n % 2))  # noqa: E731
    sampling = DynamicSampling(groups=2, max_draws=2)
    scheduler, source, records, _ = scheduler_for(
        objective, script, ahead=0, dynamic_sampling=sampling
    )
    drive(scheduler, id_batches(1), tiny.variables)
    (record,) = records
    assert record.admitted_groups == 2
    assert source.counts[1] == 2 * G and source.counts[0] == G
    assert {s.attempt for s in scheduler.last_sessions if s.task == 1} == {1}
    assert record.metrics["sampling/draws"] == 2.0
    assert record.metrics["sampling/filled_groups"] == 1.0
    assert record.metrics["sampling/informative_share"] == pytest.approx(1 / 3)


def test_dynamic_sampling_refusals(tiny, objective):
    script = lambda task, n: Plan()  # noqa: E731
    with pytest.raises(ValueError, match="admit: dynamic sampling admits its own 2 groups"):
        scheduler_for(objective, script, admit=1, dynamic_sampling=DynamicSampling(2))
    scheduler, *_ = scheduler_for(objective, script, ahead=0,
                                  dynamic_sampling=DynamicSampling(3))  # fmt: skip
    with pytest.raises(ValueError, match="dynamic_sampling_groups: expected at most the 2 tasks"):
        drive(scheduler, id_batches(1), tiny.variables)
    scheduler.close()


def test_stale_rollouts_are_discarded_and_running_ones_cancelled(tiny, objective):
    # batch 0: sample 0 of task 0 reports a call from version 0 while 3 updates are done
    def script(task, n):
        if task >= 10:  # batch 1, submitted ahead under version 0: it would run for a minute
            return Plan(delay=60.0) if n < G else Plan()
        return Plan()

    scheduler, source, records, pushes = scheduler_for(objective, script, ahead=1)
    drive(scheduler, id_batches(2), tiny.variables, updates=[0, 3])
    first, second = records
    assert first.pushed is None and second.updates == 3
    # the trainer ran ahead: the weights were refreshed before anything was resubmitted
    assert pushes.versions[0] == 3
    # batch 1's rollouts were submitted under version 0, past max_lag=1: cancelled unwaited
    assert second.resubmitted == {"stale": 4} and second.cancelled == 4
    assert sorted(source.cancelled) == [(10, 0), (10, 1), (11, 0), (11, 1)]
    assert second.version == 3 and second.lag == 0
    versions = {c.version for s in scheduler.last_sessions for c in s.calls}
    assert versions == {3}


def test_a_stale_finished_rollout_is_resubmitted(tiny, objective):
    script = lambda task, n: Plan(version=0) if n == 0 else Plan()  # noqa: E731
    scheduler, _, records, _ = scheduler_for(objective, script, ahead=0, max_lag=1)
    weights = scheduler.weights
    weights.load(tiny.variables, 5)
    drive(scheduler, id_batches(1), tiny.variables, updates=[5])
    (record,) = records
    assert record.resubmitted == {"stale": 2} and record.lag == 0


# ---------------------------------------------------------------- packing


def test_groups_that_do_not_fit_are_cut_and_one_too_big_raises(tiny, objective):
    # three calls that do not extend each other: three chains of 5 ids; 4 fit a 24-wide row
    script = lambda task, n: Plan(calls=3, delay=0.0 if task == 0 else 0.2)  # noqa: E731
    scheduler, _, records, _ = scheduler_for(objective, script, ahead=0, rows=2)
    out = drive(scheduler, id_batches(1), tiny.variables)[0]
    (record,) = records
    assert record.cut == 1 and record.admitted_groups == 1
    assert out["input_ids"].shape == (2, WIDTH)
    scheduler, _, _, _ = scheduler_for(objective, script, ahead=0, rows=1)
    with pytest.raises(ValueError, match="needs 2 rows of width 24 on its own, more than rows=1"):
        drive(scheduler, id_batches(1), tiny.variables)


def test_old_log_probs_are_rescored_under_the_current_weights(tiny, objective):
    scheduler, _, _, _ = scheduler_for(objective, lambda task, n: Plan(), ahead=0)
    (out,) = drive(scheduler, id_batches(1), tiny.variables)
    fields = {k: v for k, v in out.items() if k != "old_log_probs"}
    want = np.asarray(objective.packed_log_probs(tiny.variables, fields))
    np.testing.assert_allclose(out["old_log_probs"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["behavior_log_probs"][out["response_mask"] == 1] < 0, True)


def test_an_adaptive_correction_measures_each_packed_batch(tiny, objective):
    from dew.rollouts.correction_caps import AdaptiveCorrection

    correction = AdaptiveCorrection(0.9, band=True, decay=0.5)
    scheduler, _, records, _ = scheduler_for(
        objective, lambda task, n: Plan(), ahead=0, correction=correction
    )
    first, second = drive(scheduler, id_batches(2), tiny.variables)
    # what the loss will read: one value per row, measured from this batch's own ratios
    keep = (first["response_mask"] > 0) & (first["session_index"] >= 0)
    ratios = np.exp(first["old_log_probs"] - first["behavior_log_probs"])[keep]
    measured = max(1.0, float(np.quantile(ratios.astype(np.float64), 0.9)))
    assert float(first["behavior_cap"][0]) == pytest.approx(measured, rel=1e-5)
    assert first["behavior_floor"].shape == (B * G,)
    assert records[0].metrics["correction/cap"] == pytest.approx(measured, rel=1e-5)
    assert scheduler.last_metrics["correction/cap"] == pytest.approx(correction.cap)
    # the second batch moves the running estimate half way; the state round-trips
    assert scheduler.state_dict() == {"correction": correction.state_dict()}
    other, _, _, _ = scheduler_for(objective, lambda task, n: Plan(), ahead=0,
                                   correction=AdaptiveCorrection(0.9, band=True, decay=0.5))  # fmt: skip
    other.load_state_dict(scheduler.state_dict())
    assert other.correction.state_dict() == correction.state_dict()
    assert float(second["behavior_cap"][0]) == pytest.approx(correction.cap, rel=1e-6)


# ---------------------------------------------------------------- failures and refusals


def test_a_source_that_raises_cancels_the_batch_and_propagates(tiny, objective):
    def script(task, n):
        return Plan(raise_error=True) if (task, n) == (1, 0) else Plan(delay=30.0)

    scheduler, source, _, _ = scheduler_for(objective, script, ahead=0)
    with pytest.raises(RuntimeError, match="source broke on task 1"):
        drive(scheduler, id_batches(1), tiny.variables)
    assert sorted(source.cancelled) == [(0, 0), (0, 1), (1, 1)]


def test_pushes_every_sync_every_updates(tiny, objective):
    scheduler, _, records, pushes = scheduler_for(
        objective, lambda task, n: Plan(), ahead=1, sync_every=2, max_lag=2
    )
    drive(scheduler, id_batches(5), tiny.variables)
    assert pushes.versions == [2, 4]
    assert [r.pushed for r in records] == [None, None, 2, None, 4]
    assert max(r.lag for r in records) <= 2


class Stuck:
    """Weights whose load never moves the version (a replica that silently kept the old)."""

    def __init__(self):
        self.version = 0
        self.loads = 0

    def load(self, variables, version):
        self.loads += 1


def test_a_push_that_does_not_move_the_version_is_retried_once_then_raises(tiny, objective):
    weights = Stuck()
    scheduler, _, _, _ = scheduler_for(objective, lambda t, n: Plan(), weights=weights, ahead=0)
    with pytest.raises(RuntimeError, match="pushing version 1 left the served version at 0"):
        drive(scheduler, id_batches(2), tiny.variables)
    assert weights.loads == 2


def test_construction_refusals(tiny, objective):
    def make(target=objective, **options):
        return scheduler_for(target, lambda t, n: Plan(), **options)

    with pytest.raises(ValueError, match=r"ahead \+ sync_every - 1 = 2 updates old"):
        make(ahead=2, sync_every=1, max_lag=1)
    plain = GRPOObjective(objective.model, seq_len=WIDTH - 1)
    with pytest.raises(ValueError, match="objective.behavior_importance: max_lag=1"):
        make(plain)
    make(plain, ahead=0, max_lag=0)  # a synchronous schedule needs no correction
    with pytest.raises(ValueError, match="width: the objective trains rows 24 wide"):
        make(width=16)
    with pytest.raises(ValueError, match="truncation: expected one of"):
        make(truncation="drop")
    with pytest.raises(TypeError, match="source: expected a SessionSource"):
        RolloutScheduler(objective, object(), Pushes().publication, width=WIDTH, rows=4,
                         tasks=task_ids, groups=2)  # fmt: skip


def test_reopening_the_stream_cancels_the_old_work(tiny, objective):
    script = lambda task, n: Plan(delay=30.0 if task >= 10 else 0.0)  # noqa: E731
    scheduler, source, _, _ = scheduler_for(objective, script, ahead=1)
    drive(scheduler, id_batches(2), tiny.variables, steps=1)  # batch 1 now in flight
    assert not source.cancelled
    scheduler.tasks(dataset_of(id_batches(2))).stream(Partition(), 1)
    assert sorted(source.cancelled) == [(10, 0), (10, 1), (11, 0), (11, 1)]


def test_progress_bar_shows_groups_in_flight_and_wait_only_on_a_terminal(
    tiny, objective, monkeypatch
):
    for tty in (True, False):
        stream = Terminal(tty)
        monkeypatch.setattr(sys, "stderr", stream)
        script = lambda task, n: Plan(delay=0.2)  # noqa: E731
        scheduler, _, records, _ = scheduler_for(objective, script, ahead=1)
        drive(scheduler, id_batches(2), tiny.variables)
        scheduler.close()
        if not tty:
            assert stream.getvalue() == ""
            continue
        lines = stream.getvalue().split("\n")
        assert len(lines) == 3 and lines[-1] == "", lines  # one bar per batch, each ended
        waits = []
        for line in lines[:2]:
            last = line.rsplit("\r", 1)[-1]
            # the batch's groups all admitted, the rollouts of the batch ahead in flight
            match = re.fullmatch(
                r"rollouts: 100%\|#+\| 2/2 groups \[\d\d:\d\d, (\d+) in flight, "
                r"waited (\d+\.\d\d)s\]",
                last,
            )
            assert match, last
            assert 0 <= int(match[1]) <= 2 * B * G
            waits.append(float(match[2]))
        assert waits[0] >= 0.1, waits  # the first batch's rollouts each took 0.2 s
        assert [r.admitted_groups for r in records] == [2, 2]


# ---------------------------------------------------------------- Trainer runs on the native server

P = 4


def prompt_dataset(count):
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        prompt = rng.integers(1, 32, size=(B, P)).astype(np.int32)
        batches.append({"prompt": prompt, "prompt_length": np.full((B,), P, np.int32)})
    return dataset_of(batches)


def even_share(data_source, completion, ground_truth, extra_info):
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


def train(objective, scheduler, data, steps):
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(1), rollout=scheduler,
                      progress=False)  # fmt: skip
    start = trainer.initial_state()
    before = jax.device_get(start.params)
    state = trainer.fit(scheduler.tasks(data), steps=steps, state=start)
    return before, jax.device_get(state.params)


def changed(before, after):
    return any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    )


def test_trainer_through_prompts_one_batch_ahead(tiny):
    objective = GRPOObjective(tiny.model, seq_len=WIDTH - 1, behavior_importance=2.0,
                              pretrained=tiny.variables)  # fmt: skip
    records = []
    with NativeRolloutServer(tiny.core("mixed")) as server:
        source = PromptSource(server, even_share, max_new_tokens=WIDTH - P)
        scheduler = RolloutScheduler(objective, source, server, width=WIDTH, rows=B * G,
                                     tasks=prompt_tasks, groups=G, ahead=1,
                                     truncation="score", log=records.append)  # fmt: skip
        before, after = train(objective, scheduler, prompt_dataset(4), 4)
        source.close()
    assert changed(before, after)
    # batch i was drawn from the weights after i - 1 updates and trained after i
    assert [r.updates for r in records] == [0, 1, 2, 3]
    assert [r.pushed for r in records] == [None, 1, 2, 3]
    assert [r.version for r in records] == [0, 0, 1, 2]
    assert [r.lag for r in records] == [0, 1, 1, 1]
    assert all(r.admitted_groups == B for r in records)


class Walk:
    """An environment: the context grows by each action and one observation id; it
    completes after two tool turns."""

    def __init__(self, task, identity):
        self.context = [int(i) for i in task.data["prompt"]]
        self.turns = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def reset(self):
        from dew.rollouts.episodes import Observation

        return Observation(self.context)

    def step(self, action):
        from dew.rollouts.episodes import EpisodeStatus, Observation

        self.turns += 1
        self.context = [*action.context.tolist(), *action.tokens.tolist(), 1]
        if self.turns == 2:
            return Observation(None, EpisodeStatus.COMPLETED, "done")
        return Observation(self.context)


def test_trainer_through_multi_turn_environments(tiny):
    objective = GRPOObjective(tiny.model, seq_len=WIDTH - 1, behavior_importance=2.0,
                              pretrained=tiny.variables)  # fmt: skip
    records = []
    with NativeRolloutServer(tiny.core("eos")) as server:
        source = EnvironmentSource(
            server, Walk, lambda task, episode: float(episode.actions[-1].tokens[0] % 3),
            max_prompt_tokens=16, max_new_tokens=3, max_turns=3, workers=4,
        )  # fmt: skip
        scheduler = RolloutScheduler(objective, source, server, width=WIDTH, rows=B * G,
                                     tasks=task_ids, groups=G, ahead=1,
                                     log=records.append)  # fmt: skip
        data = dataset_of(
            [{"task_id": np.arange(B, dtype=np.int32),
              "prompt": np.full((B, 3), 5 + i, np.int32)} for i in range(3)]
        )  # fmt: skip
        before, after = train(objective, scheduler, data, 3)
        source.close()
    assert changed(before, after)
    # two calls per session, the second extending the first: one chain per session
    assert all(len(s.calls) == 2 for s in scheduler.last_sessions)
    assert records[-1].metrics["sessions/calls_per_chain"] == 2.0
    assert [r.lag for r in records] == [0, 1, 1]


# ---------------------------------------------------------------- the handed-over batch


def test_take_checks_every_column_of_the_handed_batch():
    from dew.rollout.scheduler.tasks import TaskStream

    opened = []
    stream = TaskStream(ahead=1, on_open=opened.append)
    batches = [
        {"task_id": np.array([0, 1], np.int32), "answer": np.array([3.0, np.nan]),
         "level": np.array([[1, 2], [3, 4]])},
        {"task_id": np.array([2, 3], np.int32), "answer": np.array([5.0, 6.0]),
         "level": np.array([[5, 6], [7, 8]])},
    ]  # fmt: skip
    rows = stream.wrap(dataset_of(batches)).stream(Partition(), 0)
    with pytest.raises(RuntimeError, match=r"did not come from scheduler\.tasks"):
        stream.take(batches[0])
    first = next(rows)
    # the same values, a narrowed dtype and an added column pass; nan equals nan
    handed = {**first, "answer": first["answer"].astype(np.float32), "extra": np.zeros(2)}
    assert stream.take(handed) == 0 and opened == [0]

    second = next(rows)
    # the first column matches; a later one does not (the old check looked at the first only)
    changed = {**second, "level": np.array([[5, 6], [7, 9]])}
    message = (
        "scheduler: the batch handed over is not batch 1 of the wrapped stream: "
        "batch['level'] expected shape (2, 2) int64 [[5, 6],\n [7, 8]], "
        "got shape (2, 2) int64 [[5, 6],\n [7, 9]]; train on scheduler.tasks(dataset)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        stream.take(changed)


@pytest.mark.parametrize(
    ("column", "value", "got"),
    [
        ("answer", None, "got no such column"),
        ("answer", np.array([5.0, 6.0, 7.0]), "got shape (3,) float64 [5., 6., 7.]"),
        ("answer", np.array([5.0, 6.5]), "got shape (2,) float64 [5. , 6.5]"),
    ],
)
def test_take_names_the_column_that_differs(column, value, got):
    from dew.rollout.scheduler.tasks import TaskStream

    stream = TaskStream(ahead=0, on_open=lambda start: None)
    batch = {"task_id": np.array([2, 3], np.int32), "answer": np.array([5.0, 6.0])}
    first = next(stream.wrap(dataset_of([batch])).stream(Partition(), 0))
    handed = {k: v for k, v in first.items() if k != column}
    if value is not None:
        handed[column] = value
    expected = f"batch['answer'] expected shape (2,) float64 [5., 6.], {got}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        stream.take(handed)

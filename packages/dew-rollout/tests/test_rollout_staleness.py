"""An adaptive ``ahead``: ``AdaptiveAhead``'s rule, the scheduler choosing its horizon from a
slow or fast source (never past ``max_lag``, nothing submitted twice), its state through a
checkpoint, and the ``rollout.adapt_ahead`` config key."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from rollout_scripted import Plan, Scripted
from rollout_tiny import WIDTH

from dew.data import Dataset
from dew.data.dataset import Partition
from dew.objectives.rl.grpo import GRPOObjective
from dew.recipes.rollout_config import AdaptAhead, rollout_config
from dew.recipes.schema import ConfigError
from dew.rollout import Publication, RolloutScheduler, task_ids
from dew.rollout.recipe import schedule_ahead
from dew.rollout.scheduler.staleness import AdaptiveAhead, off_policy_gap

B, G = 2, 2


@pytest.fixture(scope="module")
def objective(tiny):
    return GRPOObjective(tiny.model, seq_len=WIDTH - 1, behavior_importance=2.0)


# ---------------------------------------------------------------- the rule


def test_the_rule_steps_up_on_waiting_down_on_the_gap_within_its_bounds():
    control = AdaptiveAhead(target_wait=0.1, max_gap=0.5, start=1)
    assert control.bind(2) == 1
    assert control.observe(None, 0.1) == 1  # nothing measured yet
    assert control.observe(0.05, 0.1, 1.0) == 1  # neither: keep
    assert control.observe(0.5, 0.1, 1.0) == 2  # waiting, level 2 untried: up
    assert control.observe(0.5, 0.1, 9.0) == 2  # level 2 does not show yet: held
    assert control.observe(0.5, 0.1, 0.5) == 2  # faster than level 1: stay, capped
    assert control.observe(0.9, 0.6, 0.5) == 1  # the gap wins over waiting: down
    assert control.observe(0.0, 0.6) == 0
    assert control.observe(0.0, 0.6) == 0  # never below 0
    assert control.observe(0.1, 0.5, 1.0) == 0  # thresholds are strict
    assert control.observe(None, 0.1) == 0  # waiting not measured: held
    assert control.cycle_at == {0: 1.0, 1: 1.0, 2: 0.5}
    assert control.steps == 10


def test_drawing_further_ahead_that_does_not_speed_up_the_updates_is_undone():
    # the engine shares the trainer's cores: at level 2 an update takes as long as at 1
    control = AdaptiveAhead(target_wait=0.05, max_gap=1.0, start=1)
    control.bind(3)
    assert control.observe(None, 0.0) == 1
    assert control.observe(0.3, 0.0, 1.0) == 2  # waiting, level 2 untried: up
    assert control.observe(0.3, 0.0, 1.0) == 2  # (level 2 shows from the next call)
    assert control.observe(0.3, 0.0, 1.05) == 1  # no faster within MARGIN: back down
    assert control.observe(0.3, 0.0, 1.0) == 1
    assert control.observe(0.3, 0.0, 1.0) == 1  # the level above is not tried again
    # the rewards turn slow: one long cycle is an outlier to the median, two are not
    assert control.observe(0.6, 0.0, 2.0) == 1  # median of [1, 1, 2]: still 1.0
    assert control.observe(0.6, 0.0, 2.0) == 2  # median 1.5: level 2's 1.05 is the faster
    assert control.observe(0.6, 0.0, 2.0) == 2
    assert control.observe(0.3, 0.0, 0.95) == 3  # level 2: 1.0 (median), level 3 untried
    assert control.observe(0.3, 0.0, 0.98) == 3
    assert control.observe(0.3, 0.0, 0.98) == 2  # level 3 no faster: back to fresher
    assert control.cycle_at == pytest.approx({1: 1.5, 2: 1.0, 3: 0.98})


def test_bind_clamps_and_refusals():
    control = AdaptiveAhead(start=4)
    assert control.bind(1) == 1 and control.ahead == 1
    for kwargs, match in [
        ({"target_wait": 1.0}, r"target_wait: expected a share in \[0, 1\), got 1.0"),
        ({"max_gap": 0.0}, "max_gap: expected a finite log-ratio > 0, got 0.0"),
        ({"max_gap": float("inf")}, "max_gap: expected a finite log-ratio > 0, got inf"),
        ({"start": -1}, "start: expected an integer >= 0, got -1"),
    ]:
        with pytest.raises(ValueError, match=match):
            AdaptiveAhead(**kwargs)
    with pytest.raises(ValueError, match=r"state\['ahead'\]: expected an integer >= 0"):
        control.load_state_dict({"ahead": -2})


def test_state_dict_round_trips_exactly():
    one = AdaptiveAhead(target_wait=0.2, max_gap=0.3, start=0)
    one.bind(3)
    for wait, gap, cycle in [(0.5, 0.0, 1.0), (0.5, 0.0, 1.0), (0.0, 0.0, 1.0), (0.5, 0.9, 1.0)]:
        one.observe(wait, gap, cycle)
    other = AdaptiveAhead(target_wait=0.2, max_gap=0.3, start=0)
    other.bind(3)
    other.load_state_dict(one.state_dict())
    assert other.state_dict() == one.state_dict()
    assert one.state_dict() == {"ahead": 0, "steps": 4, "recent": [1, 1],
                                "cycles": {"0": [1.0]}}  # fmt: skip
    # the two continue identically
    for wait, gap, cycle in [(0.5, 0.0, 1.0), (0.5, 0.0, 0.8), (0.5, 0.0, 0.7), (0.5, 0.0, 0.5),
                             (0.5, 0.0, 0.5), (0.01, 0.0, 0.5), (0.5, 0.4, 0.5)]:  # fmt: skip
        assert other.observe(wait, gap, cycle) == one.observe(wait, gap, cycle)
    assert other.state_dict() == one.state_dict() and len(one.cycle_at) >= 2


def test_off_policy_gap_averages_the_masked_tokens_only():
    batch = {
        "response_mask": np.array([[0, 1, 1], [0, 0, 0]]),
        "old_log_probs": np.array([[9.0, -1.0, -2.0], [5.0, 5.0, 5.0]]),
        "behavior_log_probs": np.array([[0.0, -1.5, -1.0], [0.0, 0.0, 0.0]]),
    }
    assert off_policy_gap(batch) == pytest.approx(0.75)
    batch["response_mask"] = np.zeros((2, 3))
    assert off_policy_gap(batch) == 0.0


# ---------------------------------------------------------------- in the scheduler


def id_batches(count):
    return [{"task_id": np.arange(B, dtype=np.int32) + 10 * i} for i in range(count)]


def run(objective, tiny, delay, ahead, *, max_lag=3, batches=7, update=0.1, state=None):
    """Drive a scheduler over ``batches`` batches, sleeping ``update`` s per training step."""
    publication = Publication(lambda variables, version: None)
    source = Scripted(lambda task, n: Plan(delay=delay), publication)
    records = []
    scheduler = RolloutScheduler(objective, source, publication, width=WIDTH, rows=B * G,
                                 tasks=task_ids, groups=G, max_lag=max_lag, ahead=ahead,
                                 log=records.append)  # fmt: skip
    if state is not None:
        scheduler.load_state_dict(state)
    data = id_batches(batches)
    stream = scheduler.tasks(Dataset(train=lambda p, start=0: iter(data[start:]), batch=B))
    stream = stream.stream(Partition(), 0)
    for step in range(1, batches + 1):
        batch = next(stream)
        scheduler.at_step(step, step - 1)
        scheduler(tiny.variables, dict(batch), None)
        time.sleep(update)  # the trainer's update
    scheduler.close()
    return scheduler, source, records


def check_submissions(source, records, batches, max_lag):
    # every sample of every batch submitted exactly once (no resubmission, no double)
    counts = Counter(task for task, _, _ in source.submitted)
    want = {10 * i + t: G for i in range(batches) for t in range(B)}
    assert dict(counts) == want
    seeds = [seed for _, _, seed in source.submitted]
    assert len(set(seeds)) == len(seeds)
    assert all(r.lag <= max_lag and not r.resubmitted for r in records)


def test_a_slow_source_raises_ahead_to_the_bound_and_a_fast_one_keeps_it(tiny, objective):
    slow = AdaptiveAhead(target_wait=0.3, max_gap=100.0, start=0)
    scheduler, source, records = run(objective, tiny, 0.4, slow, batches=8)
    used = [r.metrics["staleness/ahead"] for r in records]
    assert used == sorted(used) and used[0] == 0 and scheduler.top == 3  # a level per 2+ calls
    assert "staleness/wait_share" not in records[0].metrics  # no cycle yet
    assert max(r.metrics["staleness/wait_share"] for r in records[1:]) > 0.3
    assert all(r.metrics["staleness/gap"] > 0 for r in records)
    # a level per two calls at best; a call whose batch was ready early holds it one more,
    # so under load the run may end one level short of the bound
    assert scheduler.last_metrics["staleness/next_ahead"] == slow.ahead >= 2
    assert slow.cycle_at[1] < 0.9 * slow.cycle_at[0]  # drawing ahead helped
    check_submissions(source, records, 8, 3)

    fast = AdaptiveAhead(target_wait=0.3, max_gap=100.0, start=1)
    _, source, records = run(objective, tiny, 0.0, fast, batches=4)
    assert [r.metrics["staleness/ahead"] for r in records] == [1.0] * 4 and fast.ahead == 1
    assert all(r.metrics["staleness/wait_share"] < 0.3 for r in records[1:])
    check_submissions(source, records, 4, 3)


def test_a_large_gap_lowers_ahead_and_leaves_submitted_batches_in_flight(tiny, objective):
    control = AdaptiveAhead(target_wait=0.0, max_gap=1e-9, start=3)
    scheduler, source, records = run(objective, tiny, 0.05, control, batches=6, update=0.0)
    assert [r.metrics["staleness/ahead"] for r in records] == [3, 2, 1, 0, 0, 0]
    assert [r.metrics["staleness/next_ahead"] for r in records] == [2, 1, 0, 0, 0, 0]
    # batch 3 went out with the first call (ahead 3) and was collected, not drawn again
    check_submissions(source, records, 6, 3)
    state = scheduler.state_dict()["ahead"]
    assert (state["ahead"], state["steps"], state["recent"]) == (0, 6, [0, 0])


def test_the_controller_resumes_from_the_scheduler_state(tiny, objective):
    control = AdaptiveAhead(target_wait=0.1, max_gap=100.0, start=0)
    first, _, _ = run(objective, tiny, 0.3, control, batches=3)
    state = first.state_dict()
    assert (state["ahead"]["ahead"], state["ahead"]["steps"]) == (1, 3)
    again = AdaptiveAhead(target_wait=0.1, max_gap=100.0, start=0)
    resumed, source, records = run(objective, tiny, 0.3, again, batches=3, state=state)
    assert records[0].metrics["staleness/ahead"] == 1  # the first call draws 1 ahead
    assert again.steps == 6 and again.ahead == 2
    check_submissions(source, records, 3, 3)


def test_a_fixed_ahead_records_its_staleness_too(tiny, objective):
    scheduler, _, records = run(objective, tiny, 0.0, 1, max_lag=1, batches=2, update=0.0)
    assert [r.metrics["staleness/ahead"] for r in records] == [1, 1]
    assert scheduler.state_dict() == {} and scheduler.adaptive is None


def test_refusals_of_the_schedule(objective):
    publication = Publication(lambda variables, version: None)
    source = Scripted(lambda task, n: Plan(), publication)
    options = {"width": WIDTH, "rows": B * G, "tasks": task_ids, "groups": G}
    with pytest.raises(ValueError, match=r"ahead: an AdaptiveAhead chooses within \[0, "
                       r"max_lag - sync_every \+ 1 = 1\], got start 2"):  # fmt: skip
        RolloutScheduler(objective, source, publication, max_lag=2, sync_every=2,
                         ahead=AdaptiveAhead(start=2), **options)  # fmt: skip


# ---------------------------------------------------------------- the config key


def test_the_config_key_builds_an_adaptive_ahead():
    section = rollout_config({"mode": "async", "ahead": 1, "max_lag": 4, "sync_every": 2,
                              "adapt_ahead": {"target_wait": 0.1, "max_gap": 0.2}})  # fmt: skip
    assert section.adapt_ahead == AdaptAhead(0.1, 0.2)
    ahead, top = schedule_ahead(section)
    assert isinstance(ahead, AdaptiveAhead) and top == 3
    assert (ahead.ahead, ahead.target_wait, ahead.max_gap) == (1, 0.1, 0.2)
    fixed = rollout_config({"mode": "async", "ahead": 2})
    assert fixed.adapt_ahead is None and schedule_ahead(fixed) == (2, 2)


@pytest.mark.parametrize(
    "value, message",
    [
        ({"target_wait": 1.5}, r"rollout.adapt_ahead.target_wait: expected a share in \[0, 1\)"),
        ({"max_gap": -1}, "rollout.adapt_ahead.max_gap: expected a finite number > 0, got -1"),
        ({"gap": 0.1}, "rollout.adapt_ahead.gap"),
        (3, r"rollout.adapt_ahead: expected null or a mapping \{target_wait, max_gap\}, got 3"),
    ],
)
def test_the_config_key_refuses_bad_values(value, message):
    with pytest.raises(ConfigError, match=message):
        rollout_config({"mode": "async", "adapt_ahead": value})


def test_mode_sync_refuses_the_key():
    with pytest.raises(ConfigError, match="rollout.adapt_ahead: only mode async reads it"):
        rollout_config({"adapt_ahead": {"target_wait": 0.1}})


def test_a_resumed_run_redraws_a_batch_beyond_the_lowered_horizon_under_its_version(
    tiny, objective, tmp_path
):
    """Batch 2 went out with the first call (ahead 2) under version 0; the controller then
    lowered ahead to 1. Resumed at batch 1 after one update, batch 2 is redrawn under version
    0 as the journal says, not under the version pushed after batch 1."""
    data = id_batches(3)

    def scheduler(state=None):
        publication = Publication(lambda variables, version: None)
        source = Scripted(lambda task, n: Plan(), publication)
        records = []
        made = RolloutScheduler(objective, source, publication, width=WIDTH, rows=B * G,
                                tasks=task_ids, groups=G, max_lag=2, log=records.append,
                                ahead=AdaptiveAhead(max_gap=1e-9, start=2),
                                journal=str(tmp_path / "journal"))  # fmt: skip
        if state is not None:
            made.load_state_dict(state)
        return made, records

    def drive(made, start, steps):
        dataset = Dataset(train=lambda p, start=0: iter(data[start:]), batch=B)
        stream = made.tasks(dataset).stream(Partition(), start)
        for step in range(start + 1, start + steps + 1):
            made.at_step(step, step - 1)
            made(tiny.variables, dict(next(stream)), None)

    first, _ = scheduler()
    drive(first, 0, 1)
    state = first.state_dict()
    assert state["ahead"]["ahead"] == 1
    first.close()
    resumed, records = scheduler(state)
    drive(resumed, 1, 2)
    resumed.close()
    assert [r.index for r in records] == [1, 2]
    assert [r.metrics["staleness/ahead"] for r in records] == [1, 0]
    assert records[0].pushed == 1
    assert records[1].version == 0 and records[1].lag == 2  # within max_lag=2


def test_train_grpo_chooses_ahead_from_the_config_and_checkpoints_it(tmp_path, monkeypatch):
    import json

    from test_recipe_async import grpo_config, records, write_files

    from dew.cli import main

    reward = write_files(tmp_path, delay=0.01)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "adapt"
    config = grpo_config(tmp_path, run_dir, reward, 3)
    raw = json.loads(config.read_text())
    raw["rollout"].update(max_lag=2, adapt_ahead={"target_wait": 0.0, "max_gap": 100.0})
    config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 0
    drawn = records(run_dir)
    # the first call has no cycle to measure; every later one waited more than 0: up to 2
    assert [r["staleness/ahead"] for r in drawn] == [1, 1, 2]
    assert [r["staleness/next_ahead"] for r in drawn] == [1, 2, 2]
    assert all(r["lag"] <= 2 for r in drawn)
    logged = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["staleness/ahead"] for m in logged] == [1, 1, 2]
    metas = sorted((run_dir / "checkpoints").glob("step_*/meta.json"))
    kept = json.loads(metas[-1].read_text())["extra"]["rollout"]["ahead"]
    assert (kept["ahead"], kept["steps"]) == (2, 3) and set(kept["cycles"]) == {"1"}

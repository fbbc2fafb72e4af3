"""Tool episodes: the action validation, session_of/projection and the EpisodeRollout lifecycle.

The lifecycle tests use the in-process square tool of ``_square_episodes`` with a scripted
policy (so each path is reached deterministically); the last tests train a real tiny decoder
through ``TextGeneration``, ``GRPOObjective`` and the Trainer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import sys

import jax
import numpy as np
import optax
import pytest
from _square_episodes import (
    CALL,
    EOS,
    QUESTION,
    SAY,
    VOCAB,
    Log,
    ScriptedPolicy,
    SquareEnvironment,
    square_verifier,
)

from dew.data.dataset import Dataset
from dew.inference import TextGeneration
from dew.objectives.rl import EpisodeCancelled, EpisodeFailure, EpisodeRollout
from dew.objectives.rl.grpo import GRPOObjective
from dew.rollouts.episodes import (
    Action,
    EmptyContextError,
    Episode,
    EpisodeId,
    EpisodeStatus,
    InvalidAction,
    LikelihoodError,
    MixedOriginError,
    Observation,
    TerminationError,
    TokenIdError,
    TokensAfterEosError,
    Transition,
    VerifierError,
    check_action,
    project,
    session_of,
)
from dew.sampling import Sampling
from dew.testing import TerminalStream as Terminal
from dew.testing import tiny_decoder
from dew.trainer import Trainer

P, R, K, G = 8, 4, 3, 2
SAMPLING = Sampling(eos_id=EOS)
EID = EpisodeId(task=3, step=1, sample=0, seed=7)


def action(**changes):
    fields = dict(
        context=[QUESTION, 5],
        tokens=[CALL, EOS],
        raw_log_probs=[-0.5, -0.25],
        behavior_log_probs=[-0.4, -0.2],
        terminated=True,
        policy_step=2,
    )
    fields.update(changes)
    return Action(**fields)


# ----------------------------------------------------------------------------- validation
def test_check_action_normalises_a_valid_turn():
    checked = check_action(action(), (EOS,), episode=EID, turn=0)
    assert checked.context.dtype == np.int64 and checked.tokens.tolist() == [CALL, EOS]
    assert checked.raw_log_probs.dtype == np.float64
    assert checked == action()  # value equality across the normalisation


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"context": []}, EmptyContextError, "Action.context: expected at least one id"),
        ({"context": [1, True]}, TokenIdError, "context[1]: expected an integer token id"),
        ({"tokens": [np.bool_(1), EOS]}, TokenIdError, "tokens[0]: expected an integer"),
        ({"tokens": [-2, EOS]}, TokenIdError, "tokens[0]: expected a nonnegative id, got -2"),
        ({"tokens": []}, TokenIdError, "expected at least one sampled id"),
        ({"raw_log_probs": [-0.5]}, LikelihoodError, "one log-probability per sampled id (2)"),
        ({"behavior_log_probs": None}, LikelihoodError, "behavior_log_probs: expected 2"),
        (
            {"raw_log_probs": [-0.5, np.nan]},
            LikelihoodError,
            "raw_log_probs[1]: expected a finite",
        ),
        ({"tokens": [EOS, CALL]}, TokensAfterEosError, "tokens[0]: EOS id 1 is followed by 1"),
        ({"terminated": False}, TerminationError, "False, but the last sampled id 1 is an EOS"),
        (
            {"tokens": [CALL, SAY], "terminated": True},
            TerminationError,
            "True, but the last sampled id 3 is not an EOS id",
        ),
        ({"terminated": 1}, TerminationError, "terminated: expected a bool, got 1"),
        ({"policy_step": -1}, InvalidAction, "policy_step: expected a nonnegative integer"),
    ],
)
def test_check_action_refuses_with_named_errors(changes, error, message):
    with pytest.raises(error) as caught:
        check_action(action(**changes), (EOS,), episode=EID, turn=4)
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"episode {EID}, turn 4: Action.")
    assert caught.value.episode == EID and caught.value.turn == 4


def test_no_eos_configured_means_no_turn_terminates():
    with pytest.raises(TerminationError, match="none configured"):
        check_action(action(), ())
    check_action(action(terminated=False), ())


def test_observation_and_episode_refusals():
    with pytest.raises(ValueError, match="a RUNNING observation needs the next context"):
        Observation(None)
    with pytest.raises(ValueError, match="Observation.status: expected one of RUNNING"):
        Observation([1], status="finished")
    with pytest.raises(TypeError, match=r"Observation.context\[0\]: expected an integer"):
        Observation([False])
    with pytest.raises(TypeError, match="EpisodeId.seed: expected an integer, got True"):
        EpisodeId(1, 1, 1, True)
    with pytest.raises(ValueError, match="Episode.reward: expected a finite number"):
        Episode(EID, reward=float("inf"))


# ----------------------------------------------------------------------------- projection
def _episode(status=EpisodeStatus.COMPLETED, reward=1.0, task=3, sample=0, origin=None):
    first = Observation([QUESTION, 5])
    call = check_action(action(policy_step=4), (EOS,))
    reply = Observation([QUESTION, 5, CALL, EOS, 6, 4])
    answer = check_action(
        action(
            context=[QUESTION, 5, CALL, EOS, 6, 4],
            tokens=[SAY, 6, 4, EOS],
            raw_log_probs=[-0.1, -0.2, -0.3, -0.4],
            behavior_log_probs=[-0.15, -0.25, -0.35, -0.45],
            policy_step=4,
        ),
        (EOS,),
    )
    done = Observation(None, status, "25")
    return Episode(
        EpisodeId(task, 1, sample, 0),
        first,
        (Transition(call, reply), Transition(answer, done)),
        status,
        "25",
        reward,
        origin=origin,
    )


def test_session_of_merges_an_extending_context_into_one_chain():
    session = session_of(_episode(), group=5, eos_ids=(EOS,))
    assert session.task == 3 and session.group == 5 and session.attempt == 1
    assert [c.finish_reason for c in session.calls] == ["stop", "stop"]
    assert [c.version for c in session.calls] == [4, 4]
    batch = project([_episode()], [0], width=P + R, rows=K, eos_ids=(EOS,))
    row = batch["input_ids"][0]
    # one chain: the first context, the call, the tool's reply, the answer
    assert row[:10].tolist() == [QUESTION, 5, CALL, EOS, 6, 4, SAY, 6, 4, EOS]
    assert batch["response_mask"][0, :10].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 1, 1]
    sampled = batch["response_mask"][0] == 1
    np.testing.assert_array_equal(
        batch["old_log_probs"][0][sampled], np.float32([-0.5, -0.25, -0.1, -0.2, -0.3, -0.4])
    )
    np.testing.assert_array_equal(
        batch["behavior_log_probs"][0][sampled],
        np.float32([-0.4, -0.2, -0.15, -0.25, -0.35, -0.45]),
    )
    assert batch["input_ids"].shape == (K, P + R)
    assert np.all(batch["text_segment_ids"][1:] == 0)


def test_session_of_splits_a_rewritten_context_and_maps_statuses():
    episode = _episode()
    rewritten = Transition(
        check_action(action(context=[QUESTION, 7, 7], policy_step=4), (EOS,)),
        Observation(None, EpisodeStatus.COMPLETED, "25"),
    )
    split = Episode(
        episode.id, episode.first, (episode.transitions[0], rewritten), "completed", "", 1.0
    )
    batch = project([split], [0], width=P + R, rows=K)
    segments = batch["text_segment_ids"]
    chains = {(r, int(s)) for r in range(segments.shape[0]) for s in segments[r] if s > 0}
    assert len(chains) == 2  # the rewritten context opens a second chain
    assert session_of(_episode(EpisodeStatus.ERROR)).status.name == "INFRA_ERROR"
    assert session_of(_episode(EpisodeStatus.TRUNCATED)).status.name == "TRUNCATED"
    assert session_of(_episode(EpisodeStatus.CANCELLED)).status.name == "CANCELLED"
    with pytest.raises(ValueError, match="Episode.status is RUNNING"):
        session_of(Episode(EID, Observation([QUESTION, 5])))


def test_truncated_episodes_are_masked_and_out_of_the_baseline():
    episodes = [
        _episode(reward=1.0, sample=0),
        _episode(reward=0.0, sample=1),
        _episode(EpisodeStatus.TRUNCATED, reward=50.0, sample=2),
    ]
    batch = project(episodes, [0, 0, 0], width=P + R, rows=3 * K)
    index = batch["session_index"]
    assert 2 not in index  # the truncated episode has no rows
    advantage = {s: float(batch["advantages"][index == s][0]) for s in (0, 1)}
    # baseline over the two finished episodes only: rewards 1 and 0
    assert advantage[0] == pytest.approx(1 / (np.std([1, 0], ddof=1) + 1e-6) * 0.5, rel=1e-5)
    assert advantage[1] == pytest.approx(-advantage[0])
    np.testing.assert_array_equal(batch["rewards"], np.float32([1, 0, 50]))


def test_projection_refuses_two_bindings():
    a, b = object(), object()
    project([_episode(origin=a), _episode(origin=a, sample=1)], [0, 0], width=P + R, rows=6)
    with pytest.raises(MixedOriginError, match=r"episodes\[0\] and episodes\[1\] come from two"):
        project([_episode(origin=a), _episode(origin=b, sample=1)], [0, 0], width=P + R, rows=6)


# ----------------------------------------------------------------------------- lifecycle
def make_rollout(log, policy=None, fail=None, verifier=square_verifier, **overrides):
    def factory(episode_id):
        kind = fail(episode_id) if fail is not None else None
        return SquareEnvironment(episode_id, log, kind)

    def checking_verifier(episode):
        assert episode.id in log.open, "the verifier runs while the environment is open"
        return verifier(episode)

    settings = dict(max_prompt_tokens=P, max_new_tokens=R, max_turns=K, groups=G, sampling=SAMPLING)
    settings.update(overrides)
    records = []
    rollout = EpisodeRollout(
        policy or ScriptedPolicy(),
        factory,
        checking_verifier,
        record=records.append,
        **settings,
    )
    return rollout, records


def tasks(*ids):
    return {"task_id": np.asarray(ids, np.int64)}


def test_a_cohort_runs_the_whole_lifecycle():
    log = Log()
    policy = ScriptedPolicy()
    rollout, records = make_rollout(log, policy)
    rollout.at_step(5, 3)
    batch = rollout({"params": {}}, tasks(3, 2), jax.random.key(0))
    episodes = rollout.last_episodes
    assert len(policy.bound) == 1  # one binding per collection
    assert [(e.id.task, e.id.sample, e.id.step) for e in episodes] == [
        (3, 0, 5),
        (3, 1, 5),
        (2, 0, 5),
        (2, 1, 5),
    ]
    assert all(e.status is EpisodeStatus.COMPLETED and e.reward == 1.0 for e in episodes)
    assert [e.detail for e in episodes] == ["9", "9", "4", "4"]
    assert all(a.policy_step == 3 for e in episodes for a in e.actions)
    assert log.open == set()
    # every slot is sampled together in every round, finished ones with budget 1
    assert policy.calls == [(4, [R] * 4), (4, [R] * 4)]
    for e in episodes:
        seq = [ev[0] for ev in log.events if ev[1] == e.id]
        assert seq == ["enter", "reset", "step", "step", "exit"]
    assert records == episodes
    assert batch["input_ids"].shape == (2 * G * K, P + R)
    assert batch["rewards"].tolist() == [1.0] * 4
    assert np.all(batch["advantages"] == 0)  # equal rewards in each group
    assert rollout.last_timings["tool"] > 0


def test_budget_hit_is_truncated_and_never_sent_to_the_tool():
    log = Log()
    rollout, _ = make_rollout(log, max_new_tokens=2)  # the answer [SAY, 6, 4, EOS] is cut
    batch = rollout({"params": {}}, tasks(8), jax.random.key(0))
    episodes = rollout.last_episodes
    for e in episodes:
        assert e.status is EpisodeStatus.TRUNCATED
        assert "max_new_tokens=2 without EOS" in e.detail
        assert e.actions[-1].terminated is False and e.turns == 2
        steps = [ev for ev in log.events if ev[0] == "step" and ev[1] == e.id]
        assert len(steps) == 1  # only the tool call went to the environment
    assert np.all(batch["response_mask"] == 0)  # masked
    assert log.open == set()


def test_long_contexts_and_max_turns_truncate_without_cutting_input():
    log = Log()
    rollout, _ = make_rollout(log, max_prompt_tokens=4, max_new_tokens=R)
    rollout({"params": {}}, tasks(9), jax.random.key(0))
    for e in rollout.last_episodes:
        assert e.status is EpisodeStatus.TRUNCATED
        assert "context of 6 ids exceeds max_prompt_tokens=4" in e.detail
        assert e.last_observation.context.size == 6  # recorded whole
    log = Log()
    rollout, _ = make_rollout(log, max_turns=1)
    rollout({"params": {}}, tasks(9), jax.random.key(0))
    assert {e.detail for e in rollout.last_episodes} == {"max_turns=1 reached"}
    assert log.open == set()


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("error", EpisodeFailure, EpisodeStatus.ERROR),
        ("asyncio", EpisodeCancelled, EpisodeStatus.CANCELLED),
        ("futures", EpisodeCancelled, EpisodeStatus.CANCELLED),
    ],
)
def test_failures_and_cancellations_abort_and_release_everything(kind, error, status):
    log = Log()
    failing = EpisodeId(2, 1, 1, 0)

    def fail(episode_id):
        return kind if (episode_id.task, episode_id.sample) == (2, 1) else None

    rollout, records = make_rollout(log, fail=fail)
    with pytest.raises(error) as caught:
        rollout({"params": {}}, tasks(3, 2), jax.random.key(0))
    cause = caught.value.__cause__
    expected = {
        "error": RuntimeError,
        "asyncio": asyncio.CancelledError,
        "futures": concurrent.futures.CancelledError,
    }[kind]
    assert type(cause) is expected
    partial = caught.value.episode
    assert partial.status is status and (partial.id.task, partial.id.sample) == (2, 1)
    assert partial.turns == 0 and partial.first is not None
    assert log.open == set()
    exits = [ev for ev in log.events if ev[0] == "exit"]
    assert len(exits) == 4 and all(ev[2] is cause for ev in exits)
    assert failing.task == partial.id.task and records[-1] == partial


def test_an_environment_answering_cancelled_has_no_cause():
    class Quitting(SquareEnvironment):
        def step(self, action):
            return Observation(None, EpisodeStatus.CANCELLED, "operator stopped it")

    log = Log()
    rollout = EpisodeRollout(
        ScriptedPolicy(), lambda i: Quitting(i, log), square_verifier, P, R, K, G, SAMPLING
    )
    with pytest.raises(EpisodeCancelled, match="answered CANCELLED") as caught:
        rollout({"params": {}}, tasks(1), jax.random.key(0))
    assert caught.value.__cause__ is None
    assert caught.value.episode.status is EpisodeStatus.CANCELLED
    assert log.open == set()


@pytest.mark.parametrize("bad", [float("nan"), True, "1.0x"])
def test_bad_verifier_results_abort_the_group(bad):
    log = Log()
    rollout, _ = make_rollout(log, verifier=lambda e: bad)
    with pytest.raises(EpisodeFailure, match="verifier: expected a finite float") as caught:
        rollout({"params": {}}, tasks(4), jax.random.key(0))
    assert isinstance(caught.value.__cause__, VerifierError)
    assert log.open == set()


def test_a_failed_release_discards_the_episode():
    log = Log()

    def fail(episode_id):
        return "release" if episode_id.sample == 0 else None

    rollout, _ = make_rollout(log, fail=fail)
    batch = rollout({"params": {}}, tasks(4), jax.random.key(0))
    first, second = rollout.last_episodes
    assert first.status is EpisodeStatus.ERROR and first.reward is None
    assert "release failed: OSError" in first.detail
    assert second.status is EpisodeStatus.COMPLETED
    assert 0 not in batch["session_index"] and 1 in batch["session_index"]


def test_collections_have_separate_origins_but_equal_records():
    log = Log()
    rollout, _ = make_rollout(log)
    rollout.at_step(1, 0)
    rollout({"params": {}}, tasks(4), jax.random.key(0))
    first = rollout.last_episodes
    rollout.at_step(1, 0)
    rollout({"params": {}}, tasks(4), jax.random.key(0))
    second = rollout.last_episodes
    assert first == second  # replayed public records compare equal
    with pytest.raises(MixedOriginError):
        project([first[0], second[1]], [0, 0], width=P + R, rows=2 * K)


def test_progress_bar_shows_episodes_turns_and_tool_time_only_on_a_terminal(monkeypatch):
    for tty in (True, False):
        stream = Terminal(tty)
        monkeypatch.setattr(sys, "stderr", stream)
        rollout, _ = make_rollout(Log())
        rollout({"params": {}}, tasks(3, 2), jax.random.key(0))
        if not tty:
            assert stream.getvalue() == ""
            continue
        text = stream.getvalue()
        assert text.count("\n") == 1 and text.endswith("\n")  # one bar, ended once
        draws = text[:-1].split("\r")[1:]
        pattern = (
            r"episodes: +(\d+)%\|[# ]+\| (\d)/4 episodes \[\d\d:\d\d, "
            r"turns (\d+), tool (\d+\.\d)s\]"
        )
        found = [re.fullmatch(pattern, draw) for draw in draws]
        assert all(found), draws
        # every episode takes two turns (tool call, answer): two rounds, all four done at the end
        counts = [(int(m[2]), int(m[3])) for m in found if m is not None]
        assert counts[0] == (0, 4) and counts[-1] == (4, 8), counts
        tool = rollout.last_timings["tool"]
        last = found[-1]
        assert last is not None and float(last[4]) == pytest.approx(tool, abs=0.051)


def test_constructor_refusals():
    with pytest.raises(ValueError, match="max_turns: expected an integer >= 1, got 0"):
        EpisodeRollout(ScriptedPolicy(), SquareEnvironment, square_verifier, P, R, 0, G, SAMPLING)
    with pytest.raises(TypeError, match="policy: expected bind"):
        EpisodeRollout(object(), SquareEnvironment, square_verifier, P, R, K, G, SAMPLING)
    rollout, _ = make_rollout(Log())
    with pytest.raises(KeyError, match="batch\\['task_id'\\]: missing"):
        rollout({"params": {}}, {"prompt": np.zeros((1, 2))}, jax.random.key(0))


# ----------------------------------------------------------------------------- real policy
@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, 32, init_std=0.02)


def test_a_real_policy_trains_through_the_trainer(model):
    objective = GRPOObjective(model, seq_len=P + R - 1)
    # five EOS ids make finished turns likely for an untrained decoder
    sampling = Sampling(eos_id=(EOS, CALL, SAY, 4, 5), temperature=1.0)
    log = Log()
    policy = TextGeneration(model)
    rollout = EpisodeRollout(
        policy, lambda i: SquareEnvironment(i, log), square_verifier, P, R, K, G, sampling
    )
    seen = {}

    def recording(variables, batch, key):
        out = rollout(variables, batch, key)
        seen["batch"], seen["episodes"] = out, rollout.last_episodes
        seen["variables"] = jax.device_get(variables)
        return out

    recording.at_step = rollout.at_step
    data = Dataset(train=lambda part: iter([tasks(3, 7, 1, 2)] * 4), batch=4)
    trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(1), rollout=recording)
    state = trainer.fit(data, steps=1)
    batch, episodes = seen["batch"], seen["episodes"]
    assert batch["input_ids"].shape == (4 * G * K, P + R)
    # the packed likelihoods are the policy's own: copied, and equal to a rescoring
    sampled = batch["response_mask"] == 1
    drawn = np.concatenate([a.raw_log_probs for e in episodes for a in e.actions if _trained(e)])
    assert drawn.size and sampled.sum() == drawn.size
    assert sorted(batch["old_log_probs"][sampled].tolist()) == pytest.approx(
        sorted(drawn.astype(np.float32).tolist()), abs=0
    )
    rescored = np.asarray(
        objective.packed_log_probs(seen["variables"], {k: v for k, v in batch.items()})
    )
    np.testing.assert_allclose(rescored[sampled], batch["old_log_probs"][sampled], atol=2e-4)
    assert all(e.id.step == 1 and all(a.policy_step == 0 for a in e.actions) for e in episodes)
    assert int(state.step) == 1 and log.open == set()


def _trained(episode):
    return episode.status is EpisodeStatus.COMPLETED


def test_context_tokens_are_checked_by_the_policy(model):
    """An environment that returns an id outside the vocabulary aborts the group."""

    class Wild(SquareEnvironment):
        def reset(self):
            return Observation([QUESTION, 99])

    log = Log()
    rollout = EpisodeRollout(
        TextGeneration(model), lambda i: Wild(i, log), square_verifier, P, R, K, G, SAMPLING
    )
    with pytest.raises(EpisodeFailure, match="collection: aborted by ValueError") as caught:
        rollout(
            jax.device_get(GRPOObjective(model, P + R - 1).init(jax.random.key(0))),
            tasks(1),
            jax.random.key(0),
        )
    assert "ids must lie in [0, 16)" in str(caught.value.__cause__)
    assert log.open == set()


def test_a_failed_collection_leaves_the_previous_checkpoint_intact(model, tmp_path):
    from dew.trainer import checkpoint

    log = Log()
    failure = {}

    def factory(episode_id):
        return SquareEnvironment(episode_id, log, failure["kind"] if episode_id.step == 2 else None)

    rollout = EpisodeRollout(ScriptedPolicy(), factory, square_verifier, P, R, K, G, SAMPLING)
    objective = GRPOObjective(model, seq_len=P + R - 1)
    trainer = Trainer(
        objective, optax.sgd(0.1), key=jax.random.key(1), rollout=rollout, checkpoint_every=1
    )
    data = Dataset(train=lambda part, start=0: iter([tasks(3, 7)] * 4), batch=2)
    for kind, error in (("error", EpisodeFailure), ("asyncio", EpisodeCancelled)):
        failure["kind"] = kind
        with pytest.raises(error):
            trainer.fit(data, steps=2, run_dir=tmp_path / kind)
        restored = checkpoint.latest(tmp_path / kind)
        assert restored is not None and restored.step == 1
        assert log.open == set()


def test_device_shards_sample_each_device_share_with_its_own_key():
    keys = []

    class KeyRecording(ScriptedPolicy):
        def __call__(self, contexts, budgets, key, sampling):
            keys.append(jax.random.key_data(key).tolist())
            return super().__call__(contexts, budgets, key, sampling)

    policy = KeyRecording()
    rollout, _ = make_rollout(Log(), policy, device_shards=True)
    rollout({"params": {}}, tasks(3, 2), jax.random.key(0))
    # gcd(2 task rows, 4 devices) = 2 shards of one task's group each, in both rounds
    assert policy.calls == [(2, [R] * 2)] * 4
    assert keys[0] != keys[1] and keys[2] != keys[3] and keys[0] != keys[2]
    assert all(e.reward == 1.0 for e in rollout.last_episodes)

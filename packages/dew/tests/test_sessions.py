"""Packing sessions into GRPO rows: merge rule, layout, advantages, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dew.objectives.rl.sessions import (
    Call,
    Session,
    Status,
    Task,
    chain_lengths,
    group_advantages,
    pack,
    rows_needed,
    session_metrics,
)


def call(prompt, sampled, *, finish="stop", version=0, raw=None, **kw):
    return Call(
        prompt_ids=list(prompt),
        sampled_ids=list(sampled),
        behavior_log_probs=[-0.5 - 0.01 * i for i in range(len(sampled))],
        finish_reason=finish,
        version=version,
        raw_log_probs=raw,
        **kw,
    )


def session(calls, reward=1.0, status=Status.COMPLETED, task=0, group=0, **kw):
    return Session(task=task, group=group, calls=calls, status=status, reward=reward, **kw)


# ---------------------------------------------------------------- merge rule


def test_call_extending_whole_chain_merges_into_one_chain():
    first = call([1, 2], [3, 4])
    second = call([1, 2, 3, 4, 5], [6])  # observation 5 after the sampled ids
    batch = pack([session([first, second])], width=8)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 0, 0]]
    assert batch["text_segment_ids"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0]]
    assert batch["text_positions"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 0]]
    assert batch["response_mask"].tolist() == [[0, 0, 1, 1, 0, 1, 0, 0]]
    assert batch["call_index"].tolist() == [[-1, -1, 0, 0, -1, 1, -1, -1]]
    assert batch["session_index"].tolist() == [[-1, -1, 0, 0, -1, 0, -1, -1]]


def test_prompt_only_prefix_does_not_merge():
    # The second prompt repeats the first prompt but not the sampled ids: a new chain.
    first = call([1, 2], [3, 4])
    second = call([1, 2, 9], [6])
    batch = pack([session([first, second])], width=8)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 1, 2, 9, 6]]
    assert batch["text_segment_ids"].tolist() == [[1, 1, 1, 1, 2, 2, 2, 2]]
    assert batch["text_positions"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]


def test_prompt_equal_to_chain_merges_without_gap():
    batch = pack([session([call([1], [2]), call([1, 2], [3])])], width=4)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0]]
    assert batch["response_mask"].tolist() == [[0, 1, 1, 0]]


def test_shorter_prompt_starts_new_chain():
    batch = pack([session([call([1, 2], [3]), call([1], [4])])], width=3, rows=2)
    assert sorted(map(tuple, batch["input_ids"].tolist())) == [(1, 2, 3), (1, 4, 0)]


# ---------------------------------------------------------------- statuses and advantages


def test_statuses_and_truncation_modes():
    sessions = [
        session([call([1], [2])], reward=1.0, status=Status.COMPLETED),
        session([call([1], [3])], reward=0.0, status=Status.AGENT_ERROR),
        session([call([1], [4], finish="length")], reward=5.0, status=Status.TRUNCATED),
        session([call([1], [5])], reward=None, status=Status.INFRA_ERROR),
        session([call([1], [6])], reward=None, status=Status.CANCELLED),
    ]
    masked = pack(sessions, width=2)
    assert sorted(masked["session_index"][masked["response_mask"] > 0].tolist()) == [0, 1]
    scored = pack(sessions, width=2, truncation="score")
    zero = pack(sessions, width=2, truncation="zero")
    for batch in (scored, zero):
        assert sorted(batch["session_index"][batch["response_mask"] > 0].tolist()) == [0, 1, 2]

    def adv(batch, index):
        return float(batch["advantages"][batch["session_index"] == index][0])

    rewards_score = np.array([1.0, 0.0, 5.0])
    expected = (rewards_score - rewards_score.mean()) / (rewards_score.std(ddof=1) + 1e-6)
    np.testing.assert_allclose([adv(scored, i) for i in range(3)], expected, rtol=1e-6)
    rewards_zero = np.array([1.0, 0.0, 0.0])
    expected = (rewards_zero - rewards_zero.mean()) / (rewards_zero.std(ddof=1) + 1e-6)
    np.testing.assert_allclose([adv(zero, i) for i in range(3)], expected, rtol=1e-6)


def test_group_advantages_follow_verl_conventions():
    rewards = [1.0, 0.0, 1.0, 1.0, 3.0, 2.0, 2.0]
    keys = ["a", "a", "a", "b", "c", "d", "d"]
    group = group_advantages(rewards, keys, "group")
    a = np.array([1.0, 0.0, 1.0])
    np.testing.assert_allclose(group[:3], (a - a.mean()) / (a.std(ddof=1) + 1e-6))
    assert group[3] == pytest.approx(1.0 / (1.0 + 1e-6))  # group of one: mean 0, std 1
    assert group[4] == pytest.approx(3.0 / (1.0 + 1e-6))
    assert group[5:].tolist() == [0.0, 0.0]  # equal rewards
    mean = group_advantages(rewards, keys, "mean")
    np.testing.assert_allclose(mean[:3], a - a.mean())
    assert mean[3] == 1.0
    rloo = group_advantages(rewards, keys, "rloo")
    np.testing.assert_allclose(rloo[:3], [1 - 0.5, 0 - 1.0, 1 - 0.5])  # r_i - mean(rest)
    assert rloo[4] == 3.0


def test_a_registered_estimator_is_used_by_name_when_packing():
    import jax.numpy as jnp

    import dew.rl as rl

    @rl.register_advantage_estimator("test-sessions-centred-max")
    def centred_max(rewards, group_ids, mask=None, eps=0.0):
        kept = jnp.where(mask > 0, rewards, -jnp.inf)
        best = jnp.max(kept)  # one baseline for the whole batch, whatever the groups
        return jnp.where(mask > 0, rewards - best, 0.0)

    rewards, keys = [1.0, 0.0, 3.0], ["a", "a", "b"]
    got = group_advantages(rewards, keys, "test-sessions-centred-max")
    np.testing.assert_array_equal(got, [-2.0, -3.0, 0.0])
    sessions = [session([call([1], [2])], reward=r, task=k) for r, k in zip(rewards, keys)]
    batch = pack(sessions, width=4, estimator="test-sessions-centred-max")
    kept = batch["response_mask"] > 0
    np.testing.assert_array_equal(np.asarray(batch["advantages"])[kept], [-2.0, -3.0, 0.0])
    with pytest.raises(ValueError, match=r"estimator: expected one of .*test-sessions-"):
        pack(sessions, width=4, estimator="max")


def test_groups_are_keyed_by_task_and_group():
    sessions = [
        session([call([1], [2])], reward=1.0, task="t", group=0),
        session([call([1], [2])], reward=0.0, task="t", group=0),
        session([call([1], [2])], reward=1.0, task="t", group=1),
        session([call([1], [2])], reward=1.0, task="t", group=1),
    ]
    batch = pack(sessions, width=2)
    per_session = {
        int(s): float(a)
        for s, a in zip(batch["session_index"].ravel(), batch["advantages"].ravel())
        if s >= 0
    }
    assert per_session[0] > 0 > per_session[1]
    assert per_session[2] == per_session[3] == 0.0


def test_session_weights_sum_to_one_per_session():
    sessions = [
        session([call([1, 2], [3, 4, 5]), call([7], [8])]),
        session([call([1], [2])], reward=0.0),
    ]
    batch = pack(sessions, width=6)
    for index in (0, 1):
        weights = batch["session_weights"][batch["session_index"] == index]
        assert weights.sum() == pytest.approx(1.0)


def test_old_log_probs_only_when_every_call_has_them():
    with_raw = [session([call([1], [2, 3], raw=[-0.1, -0.2])])]
    batch = pack(with_raw, width=4)
    np.testing.assert_allclose(batch["old_log_probs"][0], [0.0, -0.1, -0.2, 0.0])
    assert "old_log_probs" not in pack([session([call([1], [2])])], width=4)
    mixed = with_raw + [session([call([1], [2])])]
    with pytest.raises(ValueError, match="raw_log_probs"):
        pack(mixed, width=4)


def test_versions_and_behavior_on_sampled_ids_only():
    batch = pack([session([call([1, 2], [3, 4], version=7)])], width=5)
    assert batch["versions"].tolist() == [[-1, -1, 7, 7, -1]]
    np.testing.assert_allclose(batch["behavior_log_probs"][0], [0, 0, -0.5, -0.51, 0], rtol=1e-6)


# ---------------------------------------------------------------- routing and supports


def test_routed_experts_cover_whole_call_or_sampled_ids():
    full = np.arange(4 * 2 * 1, dtype=np.int16).reshape(4, 2, 1)
    sampled_only = np.full((1, 2, 1), 9, dtype=np.int16)
    s = session(
        [
            call([1, 2], [3, 4], routed_experts=full),
            call([1, 2, 3, 4, 5], [6], routed_experts=sampled_only),
        ]
    )
    batch = pack([s], width=8)
    assert batch["routed_experts"].shape == (1, 8, 2, 1)
    assert batch["routed_experts"].dtype == np.int16
    assert batch["routed"].tolist() == [[True, True, True, True, False, True, False, False]]
    np.testing.assert_array_equal(batch["routed_experts"][0, :4], full)
    np.testing.assert_array_equal(batch["routed_experts"][0, 5], sampled_only[0])


def test_support_columns_point_at_sampled_ids():
    s = session([call([1, 2], [3, 4], support=[[3, 5], [4, 6, 7]])])
    t = session([call([8], [9], support=[[9]])], reward=0.0)
    batch = pack([s, t], width=6, support_capacity=8)
    ids, cols = batch["support_ids"][0], batch["support_columns"][0]
    kept = {}
    for i, c in zip(ids.tolist(), cols.tolist()):
        if c >= 0:
            kept.setdefault(c, []).append(i)
    for column, group in kept.items():
        assert batch["response_mask"][0, column] == 1
        assert batch["input_ids"][0, column] in group
    assert sorted(len(g) for g in kept.values()) == [1, 2, 3]
    assert (ids[cols < 0] == -1).all()
    with pytest.raises(ValueError, match="support_capacity"):
        pack([s, t], width=6)
    with pytest.raises(ValueError, match="support_capacity"):
        pack([s, t], width=6, support_capacity=4)


def test_support_must_contain_sampled_id():
    with pytest.raises(ValueError, match="support"):
        call([1], [3], support=[[4, 5]])


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": [], "sampled_ids": [1], "behavior_log_probs": [0.0]}, "prompt_ids"),
        ({"prompt_ids": [1, -2], "sampled_ids": [1], "behavior_log_probs": [0.0]}, "nonnegative"),
        ({"prompt_ids": [True], "sampled_ids": [1], "behavior_log_probs": [0.0]}, "integer"),
        ({"prompt_ids": [1.5], "sampled_ids": [1], "behavior_log_probs": [0.0]}, "integer"),
        (
            {"prompt_ids": np.array([True]), "sampled_ids": [1], "behavior_log_probs": [0.0]},
            "dtype",
        ),
        ({"prompt_ids": [1], "sampled_ids": [1, 2], "behavior_log_probs": [0.0]}, "one value"),
        ({"prompt_ids": [1], "sampled_ids": [1], "behavior_log_probs": [np.nan]}, "finite"),
        (
            {
                "prompt_ids": [1],
                "sampled_ids": [1],
                "behavior_log_probs": [0.0],
                "raw_log_probs": [np.inf],
            },
            "finite",
        ),
        (
            {"prompt_ids": [1], "sampled_ids": [1], "behavior_log_probs": [0.0], "version": -1},
            "version",
        ),
    ],
)
def test_bad_calls_raise_naming_the_field(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Call(**kwargs)


def test_eos_rules():
    eos = 9
    pack([session([call([1], [2, 9])])], width=4, eos_ids=eos)
    pack([session([call([1], [2, 3], finish="length")])], width=4, eos_ids=(9, 10))
    with pytest.raises(ValueError, match="followed by"):
        pack([session([call([1], [9, 2], finish="length")])], width=4, eos_ids=eos)
    with pytest.raises(ValueError, match="finish_reason"):
        pack([session([call([1], [2, 9], finish="length")])], width=4, eos_ids=eos)
    with pytest.raises(ValueError, match="finish_reason"):
        pack([session([call([1], [2, 3])])], width=4, eos_ids=eos)


def test_pack_refusals():
    good = session([call([1, 2], [3])])
    with pytest.raises(ValueError, match="rows"):
        pack([good, good, good], width=3, rows=2)
    with pytest.raises(ValueError, match="does not fit"):
        pack([good], width=2)
    with pytest.raises(ValueError, match="reward"):
        pack([session([call([1], [2])], reward=None)], width=2)
    with pytest.raises(ValueError, match="estimator"):
        pack([good], width=4, estimator="ppo")
    with pytest.raises(ValueError, match="truncation"):
        pack([good], width=4, truncation="drop")
    with pytest.raises(ValueError, match="width"):
        pack([good], width=1)
    with pytest.raises(ValueError, match="status"):
        Session(task=0, calls=[], status="finished")
    with pytest.raises(ValueError, match="reward"):
        Session(task=0, calls=[], reward=float("nan"))
    with pytest.raises(TypeError, match="Session"):
        pack([object()], width=4)


# ---------------------------------------------------------------- properties


@st.composite
def sessions_strategy(draw):
    n_sessions = draw(st.integers(1, 8))
    out = []
    for index in range(n_sessions):
        n_calls = draw(st.integers(1, 3))
        chain: list[int] = []
        calls = []
        for _ in range(n_calls):
            mode = draw(st.sampled_from(["extend", "fresh", "prompt_prefix"]))
            extra = draw(st.lists(st.integers(1, 30), min_size=0, max_size=3))
            if mode == "extend" and chain:
                prompt = chain + extra
            elif mode == "prompt_prefix" and calls:
                prompt = list(calls[-1].prompt_ids) + [31] + extra
            else:
                prompt = [draw(st.integers(1, 30))] + extra
            sampled = draw(st.lists(st.integers(1, 30), min_size=0, max_size=4))
            calls.append(call(prompt, sampled, version=draw(st.integers(0, 3))))
            chain = list(prompt) + sampled
        status = draw(st.sampled_from(list(Status)))
        reward = draw(st.floats(-2, 2, allow_nan=False))
        out.append(
            Session(
                task=draw(st.integers(0, 2)),
                group=0,
                sample=index,
                calls=calls,
                status=status,
                reward=reward,
            )
        )
    return out


def reference_chains(s: Session) -> list[list[tuple[int, int]]]:
    """Independent restatement of the merge rule: (id, call index or -1) per position."""
    chains: list[list[tuple[int, int]]] = []
    for k, c in enumerate(s.calls):
        prompt = [int(i) for i in c.prompt_ids]
        if (
            chains
            and prompt[: len(chains[-1])] == [i for i, _ in chains[-1]]
            and len(prompt) >= len(chains[-1])
        ):
            chain = chains[-1]
            chain.extend((i, -1) for i in prompt[len(chain) :])
        else:
            chain = [(i, -1) for i in prompt]
            chains.append(chain)
        chain.extend((int(i), k) for i in c.sampled_ids)
    return chains


@settings(max_examples=60, deadline=None)
@given(sessions_strategy(), st.sampled_from(["mask", "score", "zero"]))
def test_pack_properties(sessions, truncation):
    width = 24
    trained = [
        i
        for i, s in enumerate(sessions)
        if s.status in (Status.COMPLETED, Status.AGENT_ERROR)
        or (s.status is Status.TRUNCATED and truncation != "mask")
    ]
    lengths = chain_lengths(sessions, width, truncation=truncation)
    batch = pack(sessions, width, truncation=truncation)
    rows = batch["input_ids"].shape[0]
    assert rows == max(rows_needed(lengths, width), 1)
    for name, column in batch.items():
        assert column.shape[:2] == (rows, width), name

    # Recover every chain from (row, segment) and compare with the reference merge.
    found: list[list[tuple[int, int, int]]] = []
    for r in range(rows):
        seg = batch["text_segment_ids"][r]
        real = seg[seg > 0]
        ids_in_order = real[np.r_[True, np.diff(real) != 0]] if real.size else real
        np.testing.assert_array_equal(ids_in_order, np.arange(1, ids_in_order.size + 1))
        for s_id in np.unique(seg[seg > 0]):
            cols = np.flatnonzero(seg == s_id)
            assert (np.diff(cols) == 1).all(), "a chain occupies contiguous cells"
            np.testing.assert_array_equal(batch["text_positions"][r, cols], np.arange(cols.size))
            sessions_here = set(batch["session_index"][r, cols].tolist()) - {-1}
            assert len(sessions_here) <= 1
            found.append(
                [
                    (
                        int(batch["input_ids"][r, c]),
                        int(batch["call_index"][r, c]),
                        int(batch["session_index"][r, c]),
                    )
                    for c in cols
                ]
            )
        # padding is inert
        pad = seg == 0
        assert (batch["input_ids"][r, pad] == 0).all()
        assert (batch["response_mask"][r, pad] == 0).all()
    expected = []
    for i in trained:
        for chain in reference_chains(sessions[i]):
            expected.append([(t, k, i if k >= 0 else -1) for t, k in chain])
    # chains of sessions without sampled ids carry no session index; compare id/call content
    strip = sorted([(t, k) for t, k, _ in chain] for chain in found)
    assert strip == sorted([(t, k) for t, k, _ in chain] for chain in expected)
    assert sorted(map(tuple, found)) == sorted(map(tuple, expected))

    # sampled ids, behavior likelihoods and versions land where they belong
    n_sampled = sum(c.sampled_ids.size for i in trained for c in sessions[i].calls)
    assert int(batch["response_mask"].sum()) == n_sampled
    for i in trained:
        for k, c in enumerate(sessions[i].calls):
            where = (batch["session_index"] == i) & (batch["call_index"] == k)
            np.testing.assert_allclose(
                np.sort(batch["behavior_log_probs"][where]),
                np.sort(c.behavior_log_probs.astype(np.float32)),
            )
            assert (batch["versions"][where] == c.version).all()

    # advantages equal the group formula on every sampled id of the session
    rewards = [
        0.0
        if (sessions[i].status is Status.TRUNCATED and truncation == "zero")
        else sessions[i].reward
        for i in trained
    ]
    keys = [(sessions[i].task, sessions[i].group) for i in trained]
    advantages = group_advantages(rewards, keys, "group")
    for i, a in zip(trained, advantages):
        values = batch["advantages"][batch["session_index"] == i]
        np.testing.assert_allclose(values, np.float32(a), rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 32), min_size=1, max_size=40), st.integers(32, 64))
@example(lengths=[17, 23, 23, 23, 23, 23, 23], width=39)
def test_first_fit_never_overfills_and_is_not_worse_than_one_per_row(lengths, width):
    needed = rows_needed(lengths, width)
    assert sum(lengths) <= needed * width
    assert needed <= len(lengths)
    # first-fit decreasing uses at most 11/9 OPT + 1 rows. OPT is at least total / width,
    # and at least the number of chains longer than half a row (no two of them share one).
    lower = max(int(np.ceil(sum(lengths) / width)), sum(2 * n > width for n in lengths))
    assert needed <= int(np.ceil(11 / 9 * lower)) + 1


def test_fixed_rows_pad_with_empty_rows():
    batch = pack([session([call([1], [2])])], width=4, rows=3)
    assert batch["input_ids"].shape == (3, 4)
    assert batch["text_segment_ids"][1:].sum() == 0


# ---------------------------------------------------------------- metrics


def test_session_metrics():
    sessions = [
        session([call([1], [2, 3]), call([1, 2, 3], [4])], reward=1.0, components={"fmt": 1.0}),
        session([call([1], [2])], reward=0.0, components={"fmt": 0.0}),
        session([call([1], [5, 6, 7], version=1)], reward=None, status=Status.INFRA_ERROR),
    ]
    batch = pack(sessions, width=8)
    m = session_metrics(sessions, batch, latencies=[1.0, 2.0, 10.0], version=3)
    assert m["sessions/count"] == 3 and m["sessions/trained"] == 2
    assert m["sessions/calls_per_chain"] == pytest.approx(1.5)
    assert m["sessions/masked_share/infra_error"] == pytest.approx(3 / 7)
    assert m["sessions/masked_share/completed"] == 0.0
    assert m["reward/mean"] == pytest.approx(0.5)
    assert m["reward/fmt"] == pytest.approx(0.5)
    assert m["latency/max"] == 10.0 and m["latency/p50"] == 2.0
    assert m["version/lag_max"] == 3.0 and m["version/lag_mean"] == pytest.approx(8 / 3)
    assert m["packing/density"] == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="latencies"):
        session_metrics(sessions, latencies=[1.0])


def test_task_record():
    task = Task(id="gsm8k-1", data={"question": "1+1"})
    assert task.id == "gsm8k-1" and task.data["question"] == "1+1"


# ---------------------------------------------------------------- session source protocol


def test_session_source_protocol_is_reexported_and_checks_structure():
    from concurrent.futures import Future

    from dew.objectives.rl.sessions import SessionSource
    from dew.sessions import SessionSource as direct

    class Echo:
        """Answers each task at once with one completed session rewarded by its seed."""

        def __init__(self):
            self.cancelled = []

        def submit(self, task, *, seed):
            future = Future()
            future.set_result(Session(task=task.id, reward=float(seed)))
            return future

        def cancel(self, future):
            self.cancelled.append(future)

    class NoCancel:
        def submit(self, task, *, seed):
            raise AssertionError("never called")

    assert SessionSource is direct
    source = Echo()
    assert isinstance(source, SessionSource)
    assert not isinstance(NoCancel(), SessionSource)
    future = source.submit(Task("a", data={"prompt": [1]}), seed=7)
    assert future.result().reward == 7.0 and future.result().task == "a"
    source.cancel(future)
    assert source.cancelled == [future]

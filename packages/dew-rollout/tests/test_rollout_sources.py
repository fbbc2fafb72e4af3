"""PromptSource and EnvironmentSource on a real NativeRolloutServer over the tiny decoder:
every status, rewards scored from the decoded draw, and cancellation (queued, mid-draw and
between turns) releasing the environment. Threads are real: the server's stepping thread,
the reward pool and the environment workers."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest
from rollout_tiny import VOCAB

from dew.objectives.rl.sessions import SessionSource, Status, Task
from dew.rollout import EnvironmentSource, NativeRolloutServer, PromptSource, prompt_task
from dew.rollouts.episodes import EpisodeStatus, Observation

TIMEOUT = 120


class Recording:
    """The real server, remembering each draw future it handed out (for the cancel checks)."""

    def __init__(self, server):
        self.server = server
        self.draws = []

    @property
    def version(self):
        return self.server.version

    def submit(self, prompt_ids, max_new_tokens, *, seed=None):
        future = self.server.submit(prompt_ids, max_new_tokens, seed=seed)
        self.draws.append(future)
        return future

    def cancel(self, future):
        return self.server.cancel(future)

    def load(self, variables, version):
        self.server.load(variables, version)

    def close(self):
        self.server.close()


class Scores:
    """reward(data_source, completion, truth, info): the number of decoded ids plus the
    truth as a number; "boom" raises, "nan" returns nan."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, data_source, completion, ground_truth, extra_info):
        with self.lock:
            self.calls.append((data_source, completion, ground_truth, extra_info))
        if ground_truth == "boom":
            raise ZeroDivisionError("boom")
        if ground_truth == "nan":
            return math.nan
        return len(completion.split()) + float(ground_truth)


def wait_until(check, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# ---------------------------------------------------------------- PromptSource


def test_prompt_source_completed_truncated_and_scored(tiny):
    scores = Scores()
    with (
        NativeRolloutServer(tiny.core("eos")) as eos,
        NativeRolloutServer(tiny.core("plain")) as plain,
    ):
        stopping = PromptSource(eos, scores, max_new_tokens=3)
        running = PromptSource(plain, scores, max_new_tokens=3)
        assert isinstance(stopping, SessionSource) and isinstance(running, SessionSource)
        task = prompt_task(7, [1, 2, 3], "toy", "2", "info")
        done = stopping.submit(task, seed=5).result(TIMEOUT)
        cut = [running.submit(task, seed=s).result(TIMEOUT) for s in (5, 5, 6)]
        stopping.close()
        running.close()
    # EOS after one id: COMPLETED, and the reward read the text without the EOS
    assert done.status is Status.COMPLETED and done.task == 7
    (call,) = done.calls
    assert call.sampled_ids.size == 1 and call.finish_reason == "stop" and call.version == 0
    assert call.prompt_ids.tolist() == [1, 2, 3] and call.raw_log_probs is not None
    assert done.reward == 2.0
    # budget end: TRUNCATED and still scored over all three ids
    assert all(s.status is Status.TRUNCATED for s in cut)
    assert [s.reward for s in cut] == [5.0, 5.0, 5.0]
    assert cut[0].calls[0].finish_reason == "length" and cut[0].calls[0].sampled_ids.size == 3
    # the seed fixes the draw
    assert cut[0].calls[0].sampled_ids.tolist() == cut[1].calls[0].sampled_ids.tolist()
    assert cut[0].calls[0].sampled_ids.tolist() != cut[2].calls[0].sampled_ids.tolist()
    texts = [c[1] for c in scores.calls]
    assert "" in texts and " ".join(map(str, cut[0].calls[0].sampled_ids)) in texts
    assert all(c[0] == "toy" and c[3] == "info" for c in scores.calls)


def test_prompt_source_failed_reward_and_failed_draw_are_infra_errors(tiny):
    scores = Scores()
    core = tiny.core("plain")
    server = NativeRolloutServer(core)
    source = PromptSource(server, scores, max_new_tokens=4)
    boom = source.submit(prompt_task(0, [1, 2], ground_truth="boom"), seed=1).result(TIMEOUT)
    nan = source.submit(prompt_task(1, [1, 2], ground_truth="nan"), seed=1).result(TIMEOUT)
    assert boom.status is Status.INFRA_ERROR and boom.reward is None
    assert "reward failed: ZeroDivisionError: boom" in boom.detail and len(boom.calls) == 1
    assert nan.status is Status.INFRA_ERROR and "expected a finite float, got nan" in nan.detail
    # draws still queued when the server closes fail; their sessions are INFRA_ERROR
    futures = [source.submit(prompt_task(i, [3, 4], ground_truth="0"), seed=i) for i in range(6)]
    server.close()
    sessions = [f.result(TIMEOUT) for f in futures]
    failed = [s for s in sessions if s.status is Status.INFRA_ERROR]
    assert failed and all("draw failed: ServerClosed" in s.detail for s in failed)
    assert all(s.reward is None and s.calls == () for s in failed)
    source.close()
    core.run()  # finish what the closed wrapper left in the core


def test_prompt_source_cancel_resolves_now_and_frees_the_draw(tiny):
    with NativeRolloutServer(tiny.core("plain")) as native:
        server = Recording(native)
        source = PromptSource(server, Scores(), max_new_tokens=8)
        blocker = native.submit([1], 50, seed=0)  # holds the only slot
        future = source.submit(prompt_task(3, [2, 3], ground_truth="0"), seed=2)
        source.cancel(future)
        session = future.result(0)  # resolved by the cancel itself
        assert session.status is Status.CANCELLED and session.task == 3 and session.reward is None
        with pytest.raises(CancelledError):
            server.draws[0].result(TIMEOUT)
        assert blocker.result(TIMEOUT).ids.size == 50
        source.cancel(future)  # a second cancel is a no-op
        source.close()


# ---------------------------------------------------------------- EnvironmentSource


class Counter:
    """An environment over a task's prompt: each reply appends one observation id (the turn
    number) to the context; it completes after ``data["turns"]`` steps (never when 0), or
    answers ERROR / raises when ``data["fail"]`` says so. ``gate`` blocks ``step``."""

    def __init__(self, task, identity, log, gate=None):
        self.data = task.data
        self.identity = identity
        self.log = log
        self.gate = gate
        self.turn = 0
        self.context = list(self.data["prompt"])

    def __enter__(self):
        self.log.append(("enter", self.identity.seed))
        return self

    def __exit__(self, kind, error, tb):
        self.log.append(("exit", kind))
        return False

    def reset(self):
        return Observation(self.context)

    def step(self, action):
        self.log.append(("step", action.tokens.tolist()))
        if self.gate is not None:
            self.gate[0].set()
            self.gate[1].wait(TIMEOUT)
        self.turn += 1
        self.context = [*action.context.tolist(), *action.tokens.tolist(), self.turn]
        fail = self.data.get("fail")
        if fail == "raise":
            raise OSError("tool crashed")
        if fail == "error":
            return Observation(None, EpisodeStatus.ERROR, "tool said no")
        if self.turn == self.data["turns"]:
            return Observation(None, EpisodeStatus.COMPLETED, "done")
        return Observation(self.context)


def verifier_of(log, mode=None):
    def verify(task, episode):
        log.append(("verify", episode.status, episode.turns))
        if mode == "raise":
            raise KeyError("no answer")
        if mode == "nan":
            return float("nan")
        return float(episode.turns) + 0.5

    return verify


def environment_source(server, log, gate=None, verifier=None, **options):
    options = {"max_prompt_tokens": 16, "max_new_tokens": 2, "max_turns": 3, "workers": 4,
               **options}  # fmt: skip
    return EnvironmentSource(
        server,
        lambda task, identity: Counter(task, identity, log, gate),
        verifier or verifier_of(log),
        **options,
    )


def test_environment_source_multi_turn_statuses(tiny):
    log = []
    with NativeRolloutServer(tiny.core("eos")) as server:
        source = environment_source(server, log)
        assert isinstance(source, SessionSource)
        completed = source.submit(Task(1, {"prompt": [5, 6], "turns": 2}), seed=11)
        endless = source.submit(Task(2, {"prompt": [5, 6], "turns": 0}), seed=12)
        long = source.submit(Task(3, {"prompt": list(range(1, 18)), "turns": 2}), seed=13)
        done, cut, too_long = (f.result(TIMEOUT) for f in (completed, endless, long))
        source.close()
    # two turns, the second call's prompt extends the first chain with the observation id
    assert done.status is Status.COMPLETED and done.reward == 2.5 and done.detail == "done"
    first, second = done.calls
    assert first.prompt_ids.tolist() == [5, 6] and first.finish_reason == "stop"
    assert second.prompt_ids.tolist() == [5, 6, *first.sampled_ids.tolist(), 1]
    # max_turns ends a live episode TRUNCATED and it is still verified
    assert cut.status is Status.TRUNCATED and len(cut.calls) == 3 and cut.reward == 3.5
    assert "max_turns=3" in cut.detail
    # a context longer than max_prompt_tokens truncates before any draw
    assert too_long.status is Status.TRUNCATED and too_long.calls == ()
    assert "max_prompt_tokens" in too_long.detail
    # every environment entered and left normally
    assert sorted(e for e in log if e[0] == "exit") == [("exit", None)] * 3
    assert {e[1] for e in log if e[0] == "enter"} == {11, 12, 13}


def test_environment_source_budget_truncation_is_never_sent_to_the_tool(tiny):
    log = []
    with NativeRolloutServer(tiny.core("plain")) as server:
        source = environment_source(server, log)
        session = source.submit(Task(4, {"prompt": [5], "turns": 2}), seed=3).result(TIMEOUT)
        source.close()
    assert session.status is Status.TRUNCATED and session.detail == "max_new_tokens"
    assert len(session.calls) == 1 and session.calls[0].finish_reason == "length"
    assert not [e for e in log if e[0] == "step"] and session.reward == 1.5
    assert ("exit", None) in log


@pytest.mark.parametrize(
    "data, mode, detail",
    [
        ({"turns": 2, "fail": "error"}, None, None),
        ({"turns": 2, "fail": "raise"}, None, "environment failed: OSError: tool crashed"),
        ({"turns": 1}, "raise", "verifier failed: KeyError"),
        ({"turns": 1}, "nan", "verifier: expected a finite float"),
        ({"turns": 1, "prompt": [5, VOCAB + 3]}, None, "draw failed: ValueError"),
    ],
    ids=["error-status", "tool-raises", "verifier-raises", "verifier-nan", "draw-fails"],
)
def test_environment_source_infra_errors(tiny, data, mode, detail):
    log = []
    with NativeRolloutServer(tiny.core("eos")) as server:
        source = environment_source(server, log, verifier=verifier_of(log, mode))
        task = Task(5, {"prompt": [5, 6], **data})
        session = source.submit(task, seed=4).result(TIMEOUT)
        source.close()
    assert session.status is Status.INFRA_ERROR and session.reward is None
    if detail is None:
        assert session.detail == "tool said no" and not [e for e in log if e[0] == "verify"]
        assert ("exit", None) in log
    else:
        assert detail in session.detail
        exits = [e for e in log if e[0] == "exit"]
        assert len(exits) == 1 and exits[0][1] is not None  # left under the error


def test_environment_source_cancel_between_turns_releases_the_environment(tiny):
    log = []
    gate = (threading.Event(), threading.Event())
    with NativeRolloutServer(tiny.core("eos")) as server:
        source = environment_source(server, log, gate=gate)
        future = source.submit(Task(6, {"prompt": [5, 6], "turns": 3}), seed=5)
        assert gate[0].wait(TIMEOUT)  # inside the first tool step
        source.cancel(future)
        gate[1].set()
        session = future.result(TIMEOUT)
        source.close()
    assert session.status is Status.CANCELLED and session.reward is None
    assert len(session.calls) == 1 and len([e for e in log if e[0] == "step"]) == 1
    assert log[-1] == ("exit", CancelledError)


def test_environment_source_cancel_mid_draw_drops_the_draw(tiny):
    log = []
    with NativeRolloutServer(tiny.core("plain")) as native:
        server = Recording(native)
        source = environment_source(server, log, max_new_tokens=4)
        blocker = native.submit([1], 55, seed=0)  # the only slot, for 55 rounds
        future = source.submit(Task(7, {"prompt": [5, 6], "turns": 2}), seed=6)
        wait_until(lambda: len(server.draws) == 1)
        assert not server.draws[0].done() and not future.done()
        source.cancel(future)
        session = future.result(TIMEOUT)
        with pytest.raises(CancelledError):
            server.draws[0].result(TIMEOUT)
        blocker.result(TIMEOUT)
        source.close()
    assert session.status is Status.CANCELLED and session.calls == ()
    assert log == [("enter", 6), ("exit", CancelledError)]
    assert np.all(np.asarray(blocker.result().ids) >= 0)

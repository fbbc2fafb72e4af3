"""`Gateway` against the real rllm-model-gateway 0.1.0 (a subprocess on 127.0.0.1) in front
of a chat-serving vLLM stand-in (gateway_fakes.py says why not the real CPU engine).

Checked: `ready` and the model list through the gateway; a multi-turn session read back
with the engine's exact prompt ids, sampled ids and log-probs, versions from the stamps
and the calls merging into one chain; malformed traces, a dead worker and the gateway's
500 as named errors; `Publication` stamping only after both replicas serve the version.
The gateway in front of the real vLLM CPU engine is in test_rollout_vllm_gateway.py, and a
full chat session through the proxy, the gateway and that engine in test_rollout_vllm_chat.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from gateway_fakes import MODEL, FakeChatVLLM, GatewayProcess, chat
from rollout_fakes import FakeVLLM

from dew.objectives.rl.sessions import Session, chain_lengths
from dew.rollout import (
    Gateway,
    GatewayError,
    GatewayNotReady,
    MalformedTrace,
    Publication,
    PushFailed,
    SafetensorsReload,
)
from dew.rollout.traces import StampLog, calls_from_traces


@pytest.fixture(scope="module")
def engine():
    fake = FakeChatVLLM()
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def running(engine, tmp_path_factory):
    process = GatewayProcess(engine.url, tmp_path_factory.mktemp("gateway"))
    yield process
    process.close()


@pytest.fixture
def gateway(running):
    with Gateway(running.url, timeout=10) as client:
        client.ready(timeout=20)
        yield client


def converse(gateway, session, turns, between=None):
    """A harness: `turns` user messages, each answered, the history growing append-only."""
    messages = []
    for turn in range(turns):
        if between is not None:
            between(turn)
        messages.append({"role": "user", "content": f"step {turn}: go on"})
        answer = chat(gateway.base_url(session), messages, seed=turn, max_tokens=6)
        assert answer.status_code == 200, answer.text
        reply = answer.json()["choices"][0]
        assert "token_ids" not in reply and "logprobs" not in reply  # stripped for the harness
        messages.append({"role": "assistant", "content": reply["message"]["content"]})


def test_ready_lists_the_engine_model(gateway):
    assert gateway.models() == [MODEL]
    health = gateway.workers()
    assert health["healthy"] == 1 and health["total"] == 1


def test_session_calls_are_the_engines_own_ids_and_log_probs(gateway, engine):
    gateway.stamp(0)
    assert gateway.stamping == "local"  # 0.1.0 has no /admin/weight_version
    start = len(engine.answers)

    def push_before_last(turn):
        if turn == 2:
            gateway.stamp(1)

    converse(gateway, "run-a", 3, between=push_before_last)
    calls = gateway.calls("run-a")
    answers = engine.answers[start:]
    assert len(calls) == len(answers) == 3
    for call, (prompt, ids, logps, finish) in zip(calls, answers):
        np.testing.assert_array_equal(call.prompt_ids, prompt)
        np.testing.assert_array_equal(call.sampled_ids, ids)
        assert call.behavior_log_probs.tolist() == logps  # exact, as the engine sent them
        assert call.finish_reason == finish
    assert [c.version for c in calls] == [0, 0, 1]
    # the fake template is append-only, so stopped turns extend one chain
    assert [c.finish_reason for c in calls[:2]] == ["stop", "stop"]
    lengths = chain_lengths([Session(task="t", calls=calls)], 512)
    assert lengths == [calls[-1].prompt_ids.size + calls[-1].sampled_ids.size]
    gateway.delete("run-a")
    assert gateway.calls("run-a") == []


def test_traces_without_ids_or_log_probs_are_refused_by_name(gateway, engine):
    gateway.stamp(0)
    engine.drop_ids = True
    try:
        converse(gateway, "no-ids", 1)
    finally:
        engine.drop_ids = False
    with pytest.raises(
        MalformedTrace,
        match=r"session 'no-ids' trace 0\.prompt_token_ids: expected the engine's ids, got \[\]",
    ):
        gateway.calls("no-ids")
    engine.drop_logprobs = True
    try:
        converse(gateway, "no-logprobs", 1)
    finally:
        engine.drop_logprobs = False
    with pytest.raises(
        MalformedTrace, match=r"trace 0\.logprobs: expected one finite log-probability"
    ):
        gateway.calls("no-logprobs")


def good_trace(**change):
    trace = {
        "prompt_token_ids": [5, 6],
        "completion_token_ids": [7, 1],
        "logprobs": [-0.5, -0.25],
        "finish_reason": "stop",
        "timestamp": 1000.0,
        "latency_ms": 20.0,
    }
    return {**trace, **change}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompt_token_ids": None}, r"s' trace 0\.prompt_token_ids: expected a list of token"),
        ({"completion_token_ids": [7, -1]}, r"completion_token_ids: expected a list of token"),
        ({"logprobs": [-0.5]}, r"logprobs: expected 2 \(one per completion_token_ids entry\)"),
        ({"logprobs": [-0.5, float("nan")]}, r"logprobs: expected one finite log-probability"),
        ({"finish_reason": None}, r"finish_reason: expected a string, got None"),
        ({"latency_ms": "20"}, r"latency_ms: expected a finite number, got '20'"),
        ({"weight_version": -2}, r"weight_version: expected a nonnegative integer, got -2"),
    ],
)
def test_malformed_trace_fields(change, message):
    stamps = StampLog()
    stamps.record(0, at=0.0)
    with pytest.raises(MalformedTrace, match=message):
        calls_from_traces([good_trace(**change)], session="s", stamps=stamps)


def test_trace_versions_from_the_gateway_or_the_stamp_log():
    stamps = StampLog()
    stamps.record(3, at=999.0)
    stamps.record(4, at=1000.5)
    late = good_trace(timestamp=1001.0, latency_ms=100.0)  # arrived at 1000.9
    early = good_trace(timestamp=1000.0, latency_ms=500.0)  # arrived at 999.5
    stamped = good_trace(weight_version=9, timestamp=1002.0)  # a gateway that stamps
    calls = calls_from_traces([late, stamped, early], session="s", stamps=stamps)
    assert [c.version for c in calls] == [3, 4, 9]  # arrival order
    with pytest.raises(MalformedTrace, match=r"carries no version and nothing was stamped"):
        calls_from_traces([good_trace()], session="s", stamps=StampLog())
    with pytest.raises(MalformedTrace, match=r"expected a JSON list of traces, got dict"):
        calls_from_traces({"traces": []}, session="s", stamps=stamps)


def test_dead_worker_and_the_gateways_500_are_named(engine, tmp_path):
    process = GatewayProcess(engine.url, tmp_path, interval=0.2)
    try:
        with Gateway(process.url, timeout=10) as gateway:
            gateway.ready(timeout=20)
            engine.healthy = False
            deadline = time.monotonic() + 20
            while gateway.workers()["healthy"] and time.monotonic() < deadline:
                time.sleep(0.1)
            with pytest.raises(
                GatewayNotReady,
                match=r"not ready after 0\.5 s: /health/workers: 0 of 1 workers healthy "
                rf"\(dead: {engine.url}\)",
            ):
                gateway.ready(timeout=0.5, interval=0.1)
            answer = chat(gateway.base_url("dead"), [{"role": "user", "content": "hi"}])
            assert answer.status_code == 500 and answer.text == "Internal Server Error"
            with pytest.raises(GatewayError, match=r"HTTP 500.*0 of 1 workers healthy") as info:
                gateway.models()
            assert info.value.status == 500
            engine.healthy = True
            gateway.ready(timeout=20, interval=0.1)  # the worker recovers
    finally:
        engine.healthy = True
        process.close()


def test_unreachable_gateway_and_bad_arguments():
    with Gateway("http://127.0.0.1:9", timeout=2) as gateway:
        with pytest.raises(GatewayNotReady, match=r"not ready after 0\.2 s: .*connection failed"):
            gateway.ready(timeout=0.2, interval=0.1)
        with pytest.raises(GatewayError, match="connection failed"):
            gateway.stamp(0)
        with pytest.raises(ValueError, match=r"session: expected 1-128 characters.*'\.\./x'"):
            gateway.base_url("../x")
        with pytest.raises(TypeError, match="version: expected a nonnegative int, got -1"):
            gateway.stamp(-1)
    with pytest.raises(ValueError, match=r"url: expected an http\(s\) root URL, got 'gw:9'"):
        Gateway("gw:9")


def test_publication_stamps_only_after_every_replica_serves(running, pretrained, tmp_path):
    replicas = [FakeVLLM(), FakeVLLM()]
    gateway = Gateway(running.url, timeout=10)
    seen: list[tuple[int, list[str]]] = []

    def stamp(version):
        seen.append((version, [r.version for r in replicas]))
        gateway.stamp(version)

    try:
        reload = SafetensorsReload(pretrained, tmp_path / "policy", [r.url for r in replicas])
        reload.write()
        publication = Publication(reload, version=0, stamp=stamp)
        assert seen == [(0, ["default", "default"])]  # the launch stamp, no push
        assert gateway.stamps.version_at(time.time()) == 0
        publication.load(pretrained.variables, 1)
        assert seen[-1] == (1, ["1", "1"]) and publication.version == 1
        replicas[1].fail("/collective_rpc", "500")
        with pytest.raises(PushFailed, match="push of version 2 failed"):
            publication.load(pretrained.variables, 2)
        assert publication.version == 1 and seen[-1][0] == 1  # no stamp for a failed push
        assert gateway.stamps.version_at(time.time()) == 1
    finally:
        gateway.close()
        for replica in replicas:
            replica.close()


def test_concurrent_sessions_keep_their_own_calls(gateway, engine):
    gateway.stamp(0)
    threads = [threading.Thread(target=converse, args=(gateway, f"par-{i}", 2)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers = {tuple(prompt): ids for prompt, ids, _, _ in engine.answers}
    for i in range(4):
        calls = gateway.calls(f"par-{i}")
        assert len(calls) == 2
        for call in calls:
            assert answers[tuple(call.prompt_ids.tolist())] == call.sampled_ids.tolist()

"""`HarborSource` end to end: the stand-in `harbor` (harbor_standin.py says why and what of
Harbor 0.26.0 it follows) runs each trial's agent against the real rllm-model-gateway
0.1.0 through the `SandboxProxy`; sessions come back with the engine's exact calls,
the verifier's reward and Harbor's errors mapped to statuses."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gateway_fakes import FakeChatVLLM, GatewayProcess

from dew.objectives.rl.sessions import SessionSource, Status, Task
from dew.rollout import Gateway, GatewayNotReady, HarborSource, SandboxProxy
from dew.rollout.harbor import status_of, task_directory

STANDIN = [sys.executable, str(Path(__file__).with_name("harbor_standin.py"))]
GRADE = """#!/bin/sh
case "$ANSWER" in
  [a-m]*) echo 1 > "$REWARD_FILE" ;;
  *) echo 0.25 > "$REWARD_FILE" ;;
esac
"""


def make_task(root: Path, name: str, plan: dict | None = None, grade: str = GRADE) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60.0\n')
    (task / "instruction.md").write_text(f"Solve task {name}.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    (task / "tests" / "test.sh").write_text(grade)
    if plan is not None:
        (task / "standin.json").write_text(json.dumps(plan))
    return task


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    engine = FakeChatVLLM()
    process = GatewayProcess(engine.url, tmp_path_factory.mktemp("gateway"))
    proxy = SandboxProxy(process.url)
    gateway = Gateway(process.url, sandbox_url=proxy.url, timeout=10)
    gateway.stamp(0)
    yield engine, gateway, proxy
    gateway.close()
    proxy.close()
    process.close()
    engine.close()


@pytest.fixture
def source(stack, tmp_path):
    _, gateway, _ = stack
    with HarborSource(
        gateway, harbor=STANDIN, model="tiny-chat", trials=tmp_path / "trials", workers=4
    ) as harbor:
        yield harbor


def test_a_trial_returns_its_calls_and_reward(stack, source, tmp_path):
    engine, gateway, proxy = stack
    assert isinstance(source, SessionSource)
    start = len(engine.answers)
    forwarded = proxy.forwarded
    task = make_task(tmp_path, "ok")
    session = source.submit(Task("t-ok", {"path": str(task)}), seed=5).result(timeout=60)
    assert session.status is Status.COMPLETED, session.detail
    assert session.task == "t-ok" and "seed 5" in session.detail
    (trial,) = [p for p in (tmp_path / "trials").iterdir() if p.is_dir()]
    answer = (trial / "agent" / "answer.txt").read_text()
    assert session.reward == (1.0 if "a" <= answer[:1] <= "m" else 0.25)
    assert session.components == {"reward": session.reward}
    assert proxy.forwarded - forwarded == 2  # both turns went through the sandbox proxy
    config = json.loads((trial / "config.json").read_text())
    assert config["agent"]["base_url"] == f"{proxy.url}/sessions/{trial.name}/v1"
    assert config["agent"]["extra_allowed_hosts"] == ["127.0.0.1"]
    answers = engine.answers[start:]
    assert len(session.calls) == len(answers) == 2
    for call, (prompt, ids, logps, finish) in zip(session.calls, answers):
        np.testing.assert_array_equal(call.prompt_ids, prompt)
        np.testing.assert_array_equal(call.sampled_ids, ids)
        assert call.behavior_log_probs.tolist() == logps and call.finish_reason == finish
        assert call.version == 0
    assert gateway.traces(trial.name) == []  # read, then dropped from the gateway


@pytest.mark.parametrize(
    ("plan", "grade", "status", "reward", "detail"),
    [
        ({"raise": "NonZeroAgentExitCodeError"}, GRADE, Status.AGENT_ERROR, True, "NonZero"),
        ({"raise": "AgentTimeoutError"}, GRADE, Status.TRUNCATED, True, "AgentTimeoutError"),
        ({"raise": "EnvironmentStartTimeoutError"}, GRADE, Status.INFRA_ERROR, False, "Env"),
        ({"crash": 3}, GRADE, Status.INFRA_ERROR, False, "harbor exited 3 without"),
        (None, "#!/bin/sh\ntrue\n", Status.INFRA_ERROR, False, "the verifier gave no reward"),
        ({"raise": "NonZeroAgentExitCodeError"}, "#!/bin/sh\ntrue\n", Status.INFRA_ERROR, False,
         "NonZeroAgentExitCodeError: raised by the stand-in on the task's request; the verif"),
    ],
)  # fmt: skip
def test_harbor_outcomes_map_to_statuses(source, tmp_path, plan, grade, status, reward, detail):
    task = make_task(tmp_path, "case", plan, grade)
    session = source.submit(Task("t", str(task)), seed=0).result(timeout=60)
    assert session.status is status, session.detail
    assert detail in session.detail
    assert (session.reward is not None) == reward
    assert bool(session.calls) == (status is not Status.INFRA_ERROR)


def test_a_dead_worker_makes_infra_errors(tmp_path):
    engine = FakeChatVLLM()
    process = GatewayProcess(engine.url, tmp_path, interval=0.2)
    proxy = SandboxProxy(process.url)
    gateway = Gateway(process.url, sandbox_url=proxy.url, timeout=10)
    try:
        gateway.stamp(0)
        with HarborSource(gateway, harbor=STANDIN, model="m", trials=tmp_path / "t") as source:
            first = source.submit(Task("a", str(make_task(tmp_path, "a"))), seed=0)
            assert first.result(timeout=60).status is Status.COMPLETED
            engine.healthy = False
            deadline = time.monotonic() + 20
            while gateway.workers()["healthy"] and time.monotonic() < deadline:
                time.sleep(0.1)
            late = source.submit(Task("b", str(make_task(tmp_path, "b"))), seed=0)
            session = late.result(timeout=60)
        assert session.status is Status.INFRA_ERROR
        assert "InternalServerError: the model API answered 500" in session.detail
    finally:
        gateway.close()
        proxy.close()
        process.close()
        engine.close()


def test_cancel_kills_the_trial(source, tmp_path):
    task = make_task(tmp_path, "slow", {"sleep": 60})
    future = source.submit(Task("slow", str(task)), seed=0)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "trials").glob("*/config.json")):
        assert time.monotonic() < deadline, "the trial never started"
        time.sleep(0.05)
    started = time.monotonic()
    source.cancel(future)
    session = future.result(timeout=30)
    assert session.status is Status.CANCELLED and time.monotonic() - started < 15
    source.cancel(future)  # a finished future: no-op


def test_a_gateway_that_never_gets_ready_breaks_the_source(tmp_path):
    gateway = Gateway("http://127.0.0.1:9")
    with HarborSource(
        gateway, harbor=STANDIN, model="m", trials=tmp_path / "t", ready_timeout=1.5
    ) as source:
        task = Task("a", str(make_task(tmp_path, "a")))
        future = source.submit(task, seed=0)
        started = time.monotonic()
        waiting = source.submit(task, seed=1)  # submit and cancel never wait on the gateway
        source.cancel(waiting)
        assert time.monotonic() - started < 0.5
        with pytest.raises(GatewayNotReady, match=r"not ready after 1\.5 s"):
            future.result(timeout=30)
        assert waiting.result(timeout=30).status is Status.CANCELLED
    gateway.close()


def test_bad_tasks_and_arguments_are_refused(stack, tmp_path):
    _, gateway, _ = stack
    with pytest.raises(TypeError, match=r"Task\.data: expected a Harbor task directory"):
        task_directory(Task("x", 7))
    with pytest.raises(FileNotFoundError, match=r"Task\.data: '.*nowhere' is not a directory"):
        task_directory(Task("x", {"path": str(tmp_path / "nowhere")}))
    with pytest.raises(KeyError, match="tasks: no Harbor task directory for task id 3"):
        task_directory(Task(3), {4: str(tmp_path)})
    assert task_directory(Task(4), {4: str(tmp_path)}) == tmp_path
    with pytest.raises(ValueError, match="model: expected the served model's name"):
        HarborSource(gateway, model="", trials=tmp_path)
    with pytest.raises(TypeError, match="gateway: expected a dew.rollout.Gateway"):
        HarborSource("http://x", model="m", trials=tmp_path)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "status", "reward", "components"),
    [
        ({"verifier_result": {"rewards": {"reward": 0.5, "style": 1}}}, Status.COMPLETED, 0.5,
         {"reward": 0.5, "style": 1.0}),
        ({"verifier_result": {"rewards": {"pass": 1}}}, Status.COMPLETED, 1.0, {"pass": 1.0}),
        ({"verifier_result": {"rewards": {"a": 1, "b": 0}}}, Status.INFRA_ERROR, None, {}),
        ({"verifier_result": {"rewards": {"reward": "1"}}}, Status.INFRA_ERROR, None, {}),
        ({"verifier_result": None, "exception_info": {"exception_type": "AgentTimeoutError"}},
         Status.TRUNCATED, None, {}),
        ({"verifier_result": {"rewards": {"reward": 1}},
          "exception_info": {"exception_type": "ContextLengthExceededError"}},
         Status.TRUNCATED, 1.0, {"reward": 1.0}),
        ({"verifier_result": {"rewards": {"reward": 0}},
          "exception_info": {"exception_type": "ApiConnectionError"}}, Status.INFRA_ERROR, None,
         {}),
        ({"exception_info": {"no": "type"}}, Status.INFRA_ERROR, None, {}),
    ],
)  # fmt: skip
def test_status_of_harbor_results(result, status, reward, components):
    got, got_reward, got_components, _ = status_of(result)
    assert (got, got_reward, got_components) == (status, reward, components)

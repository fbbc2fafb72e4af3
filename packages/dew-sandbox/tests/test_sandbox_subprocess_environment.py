"""SubprocessEnvironment with a real worker process (``square_worker.py``): round trips,
snapshots, a hang, an exceeded memory limit, a crash, malformed and oversized replies, a
refusal, and the death of the parent process."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from dew.sandbox import SandboxLimits
from dew.sandbox.subprocess_environment import (
    MalformedReply,
    ReplyTooLarge,
    SubprocessEnvironment,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
)

WORKER = str(pathlib.Path(__file__).with_name("square_worker.py"))
EOS, CALL, SAY, QUESTION = 1, 2, 3, 14
LIMITS = SandboxLimits(cpu_seconds=5, deadline_seconds=20, address_space_bytes=1 << 30)
EPISODE = SimpleNamespace(task=7, step=3, sample=1, seed=99)


def factory(mode: str = "square", limits: SandboxLimits = LIMITS, **env: str):
    return SubprocessEnvironment([sys.executable, WORKER], limits, env={"WORKER_MODE": mode, **env})


def turn(context, tokens, terminated=True, step=0):
    return SimpleNamespace(context=context, tokens=tokens, terminated=terminated, policy_step=step)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def test_round_trip_snapshot_and_cleanup(tmp_path):
    audit = tmp_path / "audit.jsonl"
    with factory(WORKER_AUDIT=str(audit))(EPISODE) as session:
        pid, directory = session.pid, session.directory
        assert os.path.isdir(directory)
        first = session.reset()
        assert first.status == "running" and first.context == (QUESTION, 4 + 7)
        called = session.step(turn(first.context, [CALL, EOS]))
        assert called.context == (QUESTION, 11, CALL, EOS, 8, 13)  # 49
        state = session.get_state()
        done = session.step(turn(called.context, [SAY, 8, 13, EOS], step=2))
        assert (done.status, done.detail, done.context) == ("completed", "49", None)
    assert not alive(pid) and not os.path.exists(directory)
    lines = audit.read_text().splitlines()
    assert len(lines) == 2 and all('"seed": 99' in line and '"task": 7' in line for line in lines)
    # a fresh worker restored from the snapshot continues where the first one was
    with factory()(EPISODE) as restored:
        restored.set_state(state)
        again = restored.step(turn(called.context, [SAY, 8, 13, EOS]))
        assert again.detail == "49"


def test_a_hang_hits_the_session_deadline():
    limits = SandboxLimits(cpu_seconds=5, deadline_seconds=1.0)
    with factory("hang", limits)(EPISODE) as session:
        first = session.reset()
        pid = session.pid
        start = time.monotonic()
        with pytest.raises(WorkerTimeout, match="no reply to step within the session's deadline"):
            session.step(turn(first.context, [CALL, EOS]))
        assert time.monotonic() - start < 5
    assert not alive(pid)


def test_an_exceeded_memory_limit_ends_the_session():
    limits = SandboxLimits(cpu_seconds=5, deadline_seconds=20, address_space_bytes=256 << 20)
    with factory("memory", limits)(EPISODE) as session:
        first = session.reset()
        with pytest.raises(WorkerCrashed, match="exited with code 1 before answering step") as e:
            session.step(turn(first.context, [CALL, EOS]))
    assert "MemoryError" in str(e.value)


def test_a_crash_is_reported_with_its_code_and_stderr():
    with factory("crash")(EPISODE) as session:
        first = session.reset()
        with pytest.raises(WorkerCrashed, match="code 3") as caught:
            session.step(turn(first.context, [CALL, EOS]))
    assert "crashing on purpose" in str(caught.value)


@pytest.mark.parametrize(
    ("mode", "error", "message"),
    [
        ("malformed", MalformedReply, "reply: not JSON"),
        ("badstatus", MalformedReply, "reply.status: expected one of"),
        ("refuse", WorkerError, "the worker refused step: no tool for that"),
    ],
)
def test_bad_replies_are_named(mode, error, message):
    with factory(mode)(EPISODE) as session:
        first = session.reset()
        pid = session.pid
        with pytest.raises(error, match=message):
            session.step(turn(first.context, [CALL, EOS]))
        assert session.process is None  # the failing session closed itself
    assert not alive(pid)


def test_an_oversized_reply_hits_the_message_cap():
    limits = SandboxLimits(cpu_seconds=5, deadline_seconds=20, output_bytes=4096)
    with factory("oversized", limits)(EPISODE) as session:
        first = session.reset()
        with pytest.raises(ReplyTooLarge, match="exceeds the message cap of 4096 bytes"):
            session.step(turn(first.context, [CALL, EOS]))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="command: expected a nonempty argv list"):
        SubprocessEnvironment("python worker.py")
    with pytest.raises(TypeError, match="limits: expected a SandboxLimits"):
        SubprocessEnvironment([sys.executable], limits={"cpu_seconds": 1})
    with factory()(EPISODE) as session:
        session.reset()
        with pytest.raises(TypeError, match=r"action.tokens\[0\]: expected an integer id"):
            session.step(turn([14, 4], [True]))
        with pytest.raises(TypeError, match="state: expected bytes"):
            session.set_state("abc")


PARENT = textwrap.dedent(
    """
    import sys, time
    from types import SimpleNamespace
    from dew.sandbox.subprocess_environment import SubprocessEnvironment
    env = SubprocessEnvironment([sys.executable, sys.argv[1]], env={"WORKER_MODE": "hang"})
    session = env(SimpleNamespace(task=1, step=1, sample=0, seed=0)).__enter__()
    session.reset()
    print(session.pid, flush=True)
    time.sleep(3600)
    """
)


def test_the_worker_dies_with_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WORKER], stdout=subprocess.PIPE, text=True
    )
    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        end = time.monotonic() + 10
        while alive(worker) and time.monotonic() < end:
            time.sleep(0.05)
        assert not alive(worker), "the worker survived its parent"
    finally:
        parent.kill()
        parent.wait()

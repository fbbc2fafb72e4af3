"""SandboxFleet: order, concurrency, close, and cleanup when a caller is interrupted."""

from __future__ import annotations

import ctypes
import os
import pathlib
import secrets
import shutil
import signal
import tempfile
import threading
import time

import pytest
from sandbox_helpers import processes_with, sandbox_temp_dirs

from dew.sandbox import (
    ContainerRunner,
    ProcessRunner,
    Program,
    SandboxFleet,
    SandboxLimits,
    Verdict,
)

LIMITS = SandboxLimits(cpu_seconds=2, deadline_seconds=20)


def sleeper(mark: str, seconds: float, say: str = "") -> Program:
    code = f"import time\ntime.sleep({seconds})\nprint({say!r})\n"
    return Program({"main.py": code}, ["python3", "main.py", mark])


def test_outcomes_come_back_in_order() -> None:
    mark = "dew-order-" + secrets.token_hex(4)
    # Later programs finish first, so completion order differs from the given order.
    programs = [sleeper(mark, 0.3 - 0.05 * i, str(i)) for i in range(6)]
    programs.append(Program({"main.py": "raise SystemExit(3)"}, ["python3", "main.py"]))
    with SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2) as fleet:
        outcomes = fleet.run(programs)
    assert [o.text().strip() for o in outcomes[:6]] == [str(i) for i in range(6)]
    assert [o.verdict for o in outcomes] == [Verdict.COMPLETED] * 6 + [Verdict.FAILED]


def test_workers_run_programs_at_the_same_time() -> None:
    # Two programs that each wait for the other's file: they can only both finish when
    # two workers run them at once (with one worker the first times out waiting).
    shared = pathlib.Path(tempfile.mkdtemp(prefix="dew-test-shared-"))
    shared.chmod(0o777)
    code = (
        "import os, sys, time\n"
        "me, other = sys.argv[1], sys.argv[2]\n"
        "open(os.path.join(me), 'w').close()\n"
        "while not os.path.exists(other):\n"
        "    time.sleep(0.01)\n"
        "print('met')\n"
    )
    a, b = str(shared / "a"), str(shared / "b")
    programs = [
        Program({"main.py": code}, ["python3", "main.py", a, b]),
        Program({"main.py": code}, ["python3", "main.py", b, a]),
    ]
    try:
        with SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2) as fleet:
            assert [o.text() for o in fleet.run(programs)] == ["met\n", "met\n"]
        for name in ("a", "b"):
            (shared / name).unlink()
        alone = SandboxLimits(cpu_seconds=1, deadline_seconds=1)
        with SandboxFleet(ProcessRunner(), limits=alone, workers=1) as fleet:
            first = fleet.run(programs)[0]
        assert first.verdict is Verdict.TIMEOUT
    finally:
        shutil.rmtree(shared)


def test_run_after_close_and_bad_arguments() -> None:
    fleet = SandboxFleet(ProcessRunner(), workers=1)
    with pytest.raises(TypeError, match=r"programs\[1\]: expected Program, got str"):
        fleet.run([Program({}, ["true"]), "print(1)"])  # type: ignore[list-item]
    fleet.close()
    fleet.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        fleet.run([Program({}, ["true"])])
    with pytest.raises(ValueError, match="workers"):
        SandboxFleet(ProcessRunner(), workers=0)


def _assert_nothing_left(mark: str, dirs_before: set[str]) -> None:
    end = time.monotonic() + 5
    while processes_with(mark) and time.monotonic() < end:
        time.sleep(0.05)
    assert processes_with(mark) == []
    assert sandbox_temp_dirs() - dirs_before == set()


@pytest.fixture()
def sigint_raises():
    """Make SIGINT raise KeyboardInterrupt even when the runner started us with it ignored.

    A shell starts background jobs with SIGINT ignored, and Python then installs no
    handler of its own; CI may run the suite that way.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_in_the_caller_kills_everything(sigint_raises: None) -> None:
    mark = "dew-interrupt-" + secrets.token_hex(4)
    before = sandbox_temp_dirs()
    fleet = SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2)
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    timer = threading.Timer(1.0, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            fleet.run([sleeper(mark, 30) for _ in range(5)])
        assert time.monotonic() - started < 10
        _assert_nothing_left(mark, before)
        # The fleet survives an interrupted call.
        assert fleet.run([sleeper(mark, 0, "again")])[0].text() == "again\n"
    finally:
        timer.cancel()
        fleet.close()
    _assert_nothing_left(mark, before)


class Interrupted(Exception):
    pass


def test_async_exception_in_a_caller_thread_kills_everything() -> None:
    mark = "dew-async-" + secrets.token_hex(4)
    before = sandbox_temp_dirs()
    fleet = SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2)
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            # The first program ends soon, which is when the caller thread next runs
            # Python code and receives the asynchronous exception.
            fleet.run([sleeper(mark, 0.5)] + [sleeper(mark, 30) for _ in range(4)])
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            raised.append(error)

    thread = threading.Thread(target=caller)
    thread.start()
    time.sleep(0.2)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupted)
    )
    thread.join(timeout=15)
    try:
        assert not thread.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], Interrupted)
        _assert_nothing_left(mark, before)
    finally:
        fleet.close()


def test_close_from_another_thread_stops_running_programs() -> None:
    mark = "dew-close-" + secrets.token_hex(4)
    before = sandbox_temp_dirs()
    fleet = SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2)
    threading.Timer(0.8, fleet.close).start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="closed"):
        fleet.run([sleeper(mark, 30) for _ in range(4)])
    assert time.monotonic() - started < 10
    _assert_nothing_left(mark, before)


def test_interrupted_container_fleet_leaves_no_container(
    container_image: str, sigint_raises: None
) -> None:
    mark = "dew-cinterrupt-" + secrets.token_hex(4)
    before = sandbox_temp_dirs()
    runner = ContainerRunner(container_image)
    fleet = SandboxFleet(runner, limits=LIMITS, workers=2)
    main = threading.main_thread().ident
    timer = threading.Timer(2.0, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fleet.run([sleeper(mark, 30) for _ in range(4)])
        assert runner.leftover_containers() == []
        _assert_nothing_left(mark, before)
    finally:
        timer.cancel()
        fleet.close()


def test_scan_sees_a_marked_process() -> None:
    # The leak checks above rely on processes_with; make sure it can find a survivor.
    mark = "dew-scan-" + secrets.token_hex(4)
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", mark])
    try:
        end = time.monotonic() + 5
        while not processes_with(mark):
            assert time.monotonic() < end
            time.sleep(0.02)
        assert [pid for pid, _ in processes_with(mark)] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert processes_with(mark) == []
    assert os.getpid() not in [pid for pid, _ in processes_with(mark)]

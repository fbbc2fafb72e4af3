"""``dew.processes``: start, wait_ready and stop on real child processes.

The children are short Python scripts. A process is "alive" when it exists and is not a
zombie (``dew.testing.alive`` reads ``/proc``): here an orphan that dies stays a zombie
until the machine's init reaps it, which counts as gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dew.processes import ProcessExited, running, start, stop, wait_ready
from dew.testing import alive

#: A child that starts a grandchild ignoring SIGTERM, writes both pids, and sleeps; the
#: child ignores SIGTERM too when its first argument is "stubborn".
FAMILY = """
import os, signal, subprocess, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(%r, 'w').write('up'); time.sleep(60)" % (sys.argv[1] + ".up",)])
while not os.path.exists(sys.argv[1] + ".up"):
    time.sleep(0.01)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def family(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start FAMILY; the process and the (child, grandchild) pids, once both run."""
    pids = tmp_path / "pids"
    process = start([sys.executable, "-c", FAMILY, pids, mode])
    wait_ready(process, pids.exists, timeout=30, interval=0.02)
    child, grandchild = map(int, pids.read_text().split())
    assert alive(child) and alive(grandchild)
    return process, child, grandchild


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_stop_ends_a_child_and_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    process, child, grandchild = family(tmp_path, "polite")
    begun = time.monotonic()
    assert stop(process, grace=5) == -signal.SIGTERM
    assert time.monotonic() - begun < 4  # the child went at SIGTERM; no wait for the grace
    assert process.returncode == -signal.SIGTERM
    assert gone(child) and gone(grandchild)


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    process, child, grandchild = family(tmp_path, "stubborn")
    begun = time.monotonic()
    assert stop(process, grace=0.3) == -signal.SIGKILL
    assert 0.3 <= time.monotonic() - begun < 5
    assert gone(child) and gone(grandchild)


def test_stop_with_no_grace_kills_at_once(tmp_path: Path) -> None:
    process, _, grandchild = family(tmp_path, "polite")
    assert stop(process, grace=0) == -signal.SIGKILL
    assert gone(grandchild)


def test_stop_after_the_child_exited_returns_its_status_and_ends_what_it_left() -> None:
    process = start([sys.executable, "-c", "import sys; sys.exit(7)"])
    process.wait(30)
    assert stop(process) == 7
    assert stop(process, grace=0) == 7  # twice is harmless

    orphaning = start(["sh", "-c", "sleep 60 & exit 3"])
    orphaning.wait(30)
    leftovers = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and _group(int(pid)) == orphaning.pid
    ]
    assert any(alive(pid) for pid in leftovers)  # the backgrounded sleep outlived the shell
    assert stop(orphaning) == 3
    assert all(gone(pid) for pid in leftovers)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_stop_refuses_a_negative_grace() -> None:
    with running([sys.executable, "-c", "import time; time.sleep(60)"], grace=0) as process:
        with pytest.raises(ValueError, match="grace"):
            stop(process, grace=-1)
    assert process.returncode == -signal.SIGKILL


def test_the_log_receives_both_streams_and_is_appended_to(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("before\n")
    script = "import sys; print('out', flush=True); print('err', file=sys.stderr)"
    for _ in range(2):
        process = start([sys.executable, "-c", script], log=log)
        assert process.wait(30) == 0
    assert log.read_text().splitlines() == ["before", "out", "err", "out", "err"]


def test_a_separate_error_log_and_the_environment_and_folder(tmp_path: Path) -> None:
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    script = (
        "import os, sys; print(os.getcwd(), os.environ.get('PROBE')); print('e', file=sys.stderr)"
    )
    env = {**os.environ, "PROBE": "here"}
    process = start([sys.executable, "-c", script], env=env, cwd=tmp_path, log=out, error_log=err)
    assert process.wait(30) == 0
    assert out.read_text().split() == [str(tmp_path), "here"]
    assert err.read_text() == "e\n"


def test_no_log_discards_output_and_stdin_is_empty() -> None:
    process = start([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"])
    assert process.wait(30) == 0  # stdin reads '' at once instead of waiting on a terminal
    assert process.stdout is None and process.stderr is None


def test_running_stops_the_child_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with running([sys.executable, "-c", "import time; time.sleep(60)"], grace=1) as process:
            raise KeyError("boom")
    assert process.returncode == -signal.SIGTERM


def test_wait_ready_returns_once_the_predicate_holds(tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    script = f"import time, pathlib; time.sleep(0.2); pathlib.Path({str(flag)!r}).touch(); time.sleep(60)"
    with running([sys.executable, "-c", script], grace=1) as process:
        waited = wait_ready(process, flag.exists, timeout=30, interval=0.02)
        assert 0 < waited < 30
        assert process.poll() is None  # a ready child keeps running


def test_wait_ready_fails_fast_naming_the_command_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    script = "import sys; print('bad flag --foo', file=sys.stderr); sys.exit(4)"
    with running([sys.executable, "-c", script], log=log) as process:
        begun = time.monotonic()
        with pytest.raises(ProcessExited) as caught:
            wait_ready(process, lambda: False, timeout=60, log=log, interval=0.02)
        assert time.monotonic() - begun < 30
    message = str(caught.value)
    assert "exited before it was ready" in message
    assert "exit status 4" in message
    assert "sys.exit(4)" in message  # the command
    assert str(log) in message and "bad flag --foo" in message


def test_wait_ready_times_out_with_the_child_still_running(tmp_path: Path) -> None:
    log = tmp_path / "slow.log"
    with running([sys.executable, "-c", "import time; time.sleep(60)"], log=log, grace=1) as p:
        with pytest.raises(TimeoutError, match=r"not ready after 0\.3 s: .*still running"):
            wait_ready(p, lambda: False, timeout=0.3, log=log, interval=0.05)
        assert p.poll() is None
    with pytest.raises(ValueError, match="timeout"):
        wait_ready(p, lambda: True, timeout=0)

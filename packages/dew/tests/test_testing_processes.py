"""``dew.testing.processes``: the launcher of the multi-process tests, on real processes.

Small Python scripts stand in for the workers where the launcher's own behaviour is checked
(flags, environment, failure, timeout); one test joins two real JAX processes on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time

import pytest

from dew.testing import (
    ProcessGroup,
    ProcessGroupError,
    alive,
    cpu_env,
    free_port,
    run_processes,
)

ECHO = """
import argparse, json, os, sys
from dew.testing import process_arguments
args = process_arguments(argparse.ArgumentParser()).parse_args(sys.argv[2:])
print(json.dumps({"tag": sys.argv[1], "processes": args.processes, "rank": args.process_id,
                  "port": args.port, "platforms": os.environ.get("JAX_PLATFORMS"),
                  "xla": os.environ.get("XLA_FLAGS"), "extra": os.environ.get("EXTRA"),
                  "path": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]}))
print("to stderr", file=sys.stderr)
"""

FAIL = """
import os, subprocess, sys, time
rank = int(sys.argv[sys.argv.index("--process-id") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1] + f".{rank}", "w").write(f"{os.getpid()} {child.pid}")
if rank == 1:
    time.sleep(0.5)
    print("rank 1 broke: " + "x" * 50 + "THE END", file=sys.stderr)
    sys.exit(2)
time.sleep(120)
"""

JOIN = """
import argparse, json, sys
import numpy as np
from dew.testing import join_cpu, process_arguments
args = process_arguments(argparse.ArgumentParser()).parse_args(sys.argv[1:])
join_cpu(2, args.processes, args.process_id, args.port)
import jax
from jax.experimental import multihost_utils
gathered = multihost_utils.process_allgather(np.asarray([10 + jax.process_index()]))
print(json.dumps({"count": jax.process_count(), "devices": jax.device_count(),
                  "local": jax.local_device_count(), "gathered": gathered.ravel().tolist()}))
"""


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_every_rank_gets_its_place_one_port_and_a_cpu_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    echo = script(tmp_path, "echo.py", ECHO)
    ranks = run_processes(echo, "hello", processes=3, env={"EXTRA": "1"},
                          pythonpath=[tmp_path], timeout=60)  # fmt: skip
    seen = [json.loads(r.stdout) for r in ranks]
    assert [r.rank for r in ranks] == [0, 1, 2] and all(r.returncode == 0 for r in ranks)
    assert [s["rank"] for s in seen] == [0, 1, 2]
    assert {s["processes"] for s in seen} == {3}
    assert len({s["port"] for s in seen}) == 1 and seen[0]["port"] > 0
    assert all(s["tag"] == "hello" and s["platforms"] == "cpu" for s in seen)
    assert all(s["xla"] is None and s["extra"] == "1" for s in seen)
    assert all(s["path"] == str(tmp_path) for s in seen)
    assert all(r.stderr == "to stderr\n" for r in ranks)
    # one rank alone gets no flags: the worker's defaults apply
    (alone,) = run_processes(echo, "solo", timeout=60)
    assert json.loads(alone.stdout)["processes"] == 1 and json.loads(alone.stdout)["port"] == 0


def test_a_failing_rank_kills_the_group_and_shows_its_stderr(tmp_path):
    fail = script(tmp_path, "fail.py", FAIL)
    marker = tmp_path / "pids"
    start = time.monotonic()
    with pytest.raises(ProcessGroupError) as caught:
        run_processes(fail, marker, processes=2, timeout=100, tail=20)
    assert time.monotonic() - start < 60  # not the timeout: the other rank was killed
    text = str(caught.value)
    assert text.startswith("rank(s) 1 exited early")
    assert "--- rank 1: exit code 2, expected 0" in text
    assert f"--- rank 0: exit code {-signal.SIGKILL}, expected 0" in text
    assert "characters):\n" + "x" * 12 + "THE END\n" in text  # the last 20 characters
    assert "rank 1 broke" not in text
    pids = [int(p) for r in (0, 1) for p in (tmp_path / f"pids.{r}").read_text().split()]
    assert not any(alive(pid) for pid in pids[::2])  # the ranks were reaped
    deadline = time.monotonic() + 30  # SIGKILL reaches the rest of a group asynchronously
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)  # each rank's whole process group is gone


def test_a_timeout_kills_every_rank(tmp_path):
    sleeper = script(tmp_path, "sleep.py", "import time\ntime.sleep(120)\n")
    with ProcessGroup(sleeper, processes=2) as group:
        with pytest.raises(ProcessGroupError, match=r"^timed out after 1s; every rank was"):
            group.wait(timeout=1)
        assert all(p.returncode == -signal.SIGKILL for p in group.procs)


def test_expected_codes_and_signals(tmp_path):
    code = script(tmp_path, "code.py", "import sys\nsys.exit(3)\n")
    assert [r.returncode for r in run_processes(code, processes=2, expect=3)] == [3, 3]
    assert run_processes(code, expect=None)[0].returncode == 3
    with pytest.raises(ValueError, match=r"expect: expected one code per rank \(2\), got 1"):
        run_processes(code, processes=2, expect=[3])
    with pytest.raises(ValueError, match="processes: expected an integer >= 1, got 0"):
        ProcessGroup(code, processes=0)
    sleeper = script(tmp_path, "sleep.py", "import time\ntime.sleep(120)\n")
    with ProcessGroup(sleeper) as group:
        assert group.running()
        os.kill(group.procs[0].pid, signal.SIGKILL)
        (killed,) = group.wait(timeout=30, expect=-signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL


def test_alive_tells_running_from_gone(tmp_path):
    sleeper = script(tmp_path, "sleep.py", "import time\ntime.sleep(120)\n")
    with ProcessGroup(sleeper) as group:
        pid = group.procs[0].pid
        assert alive(pid) and alive(os.getpid())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(pid) and time.monotonic() < deadline:  # a zombie counts as gone
            time.sleep(0.05)
        assert not alive(pid)
        group.wait(30, expect=-signal.SIGKILL)
    assert not alive(pid)


def test_cpu_env_and_free_port(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/already")
    monkeypatch.setenv("XLA_FLAGS", "--x")
    env = cpu_env({"A": "b"}, pythonpath=["/first"])
    assert env["PYTHONPATH"] == os.pathsep.join(["/first", "/already"])
    assert "XLA_FLAGS" not in env and env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"
    port = free_port()
    assert 0 < port < 65536


def _json_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line from the worker, got: {stdout!r}"
    return lines[0]


def test_two_real_jax_processes_join_on_cpu(tmp_path):
    join = script(tmp_path, "join.py", JOIN)
    ranks = run_processes(join, processes=2, timeout=240)
    # Gloo's C++ logger writes to the same stdout ("[Gloo] Rank 1 is connected ..."), and
    # may flush after the worker's JSON line: read the line the worker printed, not the last.
    seen = [json.loads(_json_line(r.stdout)) for r in ranks]
    for s in seen:
        assert s == {"count": 2, "devices": 4, "local": 2, "gathered": [10, 11]}

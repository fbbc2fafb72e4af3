"""ContainerRunner against a real engine: isolation settings, verdicts, cleanup.

Skips, saying why, when no engine is reachable (DOCKER_HOST unset or not answering);
tools/ci/container_engine.sh starts one as root.
"""

from __future__ import annotations

import signal
import socket
import textwrap

import pytest
from sandbox_helpers import sandbox_temp_dirs

from dew.sandbox import ContainerRunner, Program, SandboxLimits, Verdict, engine_unavailable_reason

LIMITS = SandboxLimits(cpu_seconds=1, deadline_seconds=3, output_bytes=4096, memory_bytes=64 << 20)


def py(code: str, stdin: str = "") -> Program:
    return Program({"main.py": textwrap.dedent(code)}, ["python3", "main.py"], stdin=stdin)


def test_isolation_settings_seen_from_inside(container_runner: ContainerRunner) -> None:
    code = """
        import os
        status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
        print(os.getuid(), os.getgid())
        print(status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip())
        print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
        for path in ("/work/new.txt", "/etc/new.txt", "/usr/new.txt"):
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError as error:
                print("refused", error.errno)
        open("/tmp/scratch", "w").write("tmp is writable")
        print(open("/tmp/scratch").read())
        print(os.getcwd(), sorted(os.listdir(".")))
    """
    outcome = container_runner.run(py(code), LIMITS)
    assert outcome.verdict is Verdict.COMPLETED, outcome
    lines = outcome.text().splitlines()
    assert lines[0] == "65534 65534"
    assert lines[1] == "0000000000000000 0000000000000000 1"
    assert lines[2] == "['lo']"  # network "none": loopback only
    assert lines[3:6] == ["refused 30"] * 3  # EROFS: /work and the root are read-only
    assert lines[6] == "tmp is writable"
    assert lines[7] == "/work ['main.py']"


def test_no_network_to_the_host(container_runner: ContainerRunner) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = f"""
            import socket
            for host in ("127.0.0.1", "1.1.1.1"):
                try:
                    socket.create_connection((host, {port}), timeout=0.5).close()
                    print("connected", host)
                except OSError as error:
                    print("refused", host, error.errno)
        """
        outcome = container_runner.run(py(code), LIMITS)
    finally:
        listener.close()
    lines = outcome.text().splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["refused", "127.0.0.1"],
        ["refused", "1.1.1.1"],
    ]


@pytest.mark.parametrize(
    ("code", "verdict", "exit_code"),
    [
        ("print('ok')", Verdict.COMPLETED, 0),
        ("import sys; sys.exit(5)", Verdict.FAILED, 5),
        ("import time; time.sleep(30)", Verdict.TIMEOUT, -signal.SIGKILL),
        # SIGXCPU at the CPU limit, or SIGKILL at the deadline on a loaded machine.
        ("while True: pass", Verdict.TIMEOUT, (-signal.SIGXCPU, -signal.SIGKILL)),
        ("import os; os.kill(os.getpid(), 11)", Verdict.CRASHED, -signal.SIGSEGV),
        ("x = bytearray(200 << 20)", Verdict.CRASHED, -signal.SIGKILL),  # memory cgroup
        # The write fits in the pipe, so the program may exit before the kill lands.
        ("print('y' * 10000)", Verdict.OUTPUT_LIMIT, (0, -signal.SIGKILL)),
    ],
)
def test_each_verdict(
    container_runner: ContainerRunner, code: str, verdict: Verdict, exit_code: int | tuple[int, ...]
) -> None:
    outcome = container_runner.run(py(code), LIMITS)
    assert outcome.verdict is verdict, outcome
    allowed = exit_code if isinstance(exit_code, tuple) else (exit_code,)
    assert outcome.exit_code in allowed
    if verdict is Verdict.OUTPUT_LIMIT:
        assert outcome.stdout == b"y" * LIMITS.output_bytes


def test_stdin_and_stderr(container_runner: ContainerRunner) -> None:
    code = """
        import sys
        print(sum(int(x) for x in sys.stdin.read().split()))
        sys.stderr.write("note")
    """
    outcome = container_runner.run(py(code, stdin="1 2 3\n4\n"), LIMITS)
    assert outcome.verdict is Verdict.COMPLETED
    assert outcome.stdout == b"10\n" and outcome.stderr == b"note"


def test_process_limit(container_runner: ContainerRunner) -> None:
    code = """
        import os, time
        n = 0
        try:
            while n < 200:
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
    """
    limits = SandboxLimits(deadline_seconds=5, processes=16)
    outcome = container_runner.run(py(code), limits)
    assert outcome.verdict is Verdict.COMPLETED, outcome
    assert 0 < int(outcome.text()) < 16


def test_missing_command_fails_and_nothing_is_left(container_runner: ContainerRunner) -> None:
    before = sandbox_temp_dirs()
    outcome = container_runner.run(Program({}, ["no-such-command-dew"]), LIMITS)
    assert outcome.verdict is Verdict.FAILED and outcome.exit_code == 127
    assert container_runner.leftover_containers() == []
    assert sandbox_temp_dirs() - before == set()


def test_missing_image_is_refused(container_image: str) -> None:
    with pytest.raises(ValueError, match="no image 'dew-sandbox-missing:none'"):
        ContainerRunner("dew-sandbox-missing:none")
    with pytest.raises(ValueError, match="runtime"):
        ContainerRunner(container_image, runtime="lxc")


def test_unreachable_engine_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine_unavailable_reason() == "no container engine: DOCKER_HOST is unset"
    socket_path = tmp_path / "nothing.sock"
    reason = engine_unavailable_reason(base_url=f"unix://{socket_path}")
    assert reason is not None
    assert reason.startswith(f"no container engine: DOCKER_HOST=unix://{socket_path} unreachable")


PARENT = """
import sys
from dew.sandbox import ContainerRunner, Program, SandboxLimits
runner = ContainerRunner(sys.argv[1])
print(runner.session, flush=True)
runner.run(Program({"main.py": "import time; time.sleep(60)"}, ["python3", "main.py"]),
           SandboxLimits(deadline_seconds=60, cpu_seconds=60))
"""


def test_containers_are_removed_when_the_parent_is_killed(container_image: str) -> None:
    import subprocess
    import sys
    import time

    import docker

    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, container_image], stdout=subprocess.PIPE, text=True
    )
    client = docker.from_env(version="auto")
    try:
        assert parent.stdout is not None
        session = parent.stdout.readline().strip()
        label = {"label": f"dew.sandbox.runner={session}"}
        end = time.monotonic() + 30
        while not client.containers.list(filters={**label, "status": "running"}):
            assert time.monotonic() < end, "the container never started"
            time.sleep(0.1)
        parent.kill()
        parent.wait()
        end = time.monotonic() + 30
        while client.containers.list(all=True, filters=label):
            assert time.monotonic() < end, "the container outlived its killed parent"
            time.sleep(0.2)
        # The watchdog also deleted the job and stdin directories the parent left.
        end = time.monotonic() + 10
        while any(session in name for name in sandbox_temp_dirs()):
            assert time.monotonic() < end, "the killed parent's job directories remain"
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait()
        client.close()

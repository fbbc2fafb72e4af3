"""ProcessRunner and the launcher: every verdict, I/O, limits, cleanup, parent death."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from sandbox_helpers import processes_with, sandbox_temp_dirs

from dew.sandbox import Outcome, ProcessRunner, Program, SandboxLimits, Verdict

LIMITS = SandboxLimits(cpu_seconds=1, deadline_seconds=2, output_bytes=4096)

# Both user modes where the test can run them: own uids needs root.
MODES = [False] + ([True] if os.geteuid() == 0 else [])


def run(
    code: str,
    *,
    own_users: bool,
    stdin: bytes = b"",
    limits: SandboxLimits = LIMITS,
    argv_extra: tuple[str, ...] = (),
) -> Outcome:
    runner = ProcessRunner(own_users=own_users)
    program = Program(
        {"main.py": textwrap.dedent(code)}, ["python3", "main.py", *argv_extra], stdin=stdin
    )
    return runner.run(program, limits)


@pytest.mark.parametrize("own_users", MODES)
@pytest.mark.parametrize(
    ("code", "verdict", "exit_code"),
    [
        ("print('ok')", Verdict.COMPLETED, 0),
        ("import sys; sys.exit(4)", Verdict.FAILED, 4),
        ("raise ValueError('boom')", Verdict.FAILED, 1),
        ("import time; time.sleep(30)", Verdict.TIMEOUT, -signal.SIGKILL),
        # SIGXCPU at the CPU limit, or SIGKILL at the deadline on a loaded machine.
        ("while True: pass", Verdict.TIMEOUT, (-signal.SIGXCPU, -signal.SIGKILL)),
        ("import os; os.kill(os.getpid(), 11)", Verdict.CRASHED, -signal.SIGSEGV),
        ("import os; os.abort()", Verdict.CRASHED, -signal.SIGABRT),
        # The writer may finish and exit 0 before the kill at the cap lands.
        ("print('x' * 100000)", Verdict.OUTPUT_LIMIT, (-signal.SIGKILL, 0)),
    ],
)
def test_each_verdict(
    code: str, verdict: Verdict, exit_code: int | tuple[int, ...], own_users: bool
) -> None:
    outcome = run(code, own_users=own_users)
    assert outcome.verdict is verdict, outcome
    assert outcome.exit_code in (exit_code if isinstance(exit_code, tuple) else (exit_code,))
    assert outcome.seconds > 0


@pytest.mark.parametrize("own_users", MODES)
def test_stdin_files_and_environment(own_users: bool) -> None:
    code = """
        import os, sys
        data = sys.stdin.read()
        print(data.upper(), end="")
        print(open("pkg/helper.txt").read())
        print(sorted(os.environ))
        print(os.getcwd() == os.environ["HOME"])
        sys.stderr.write("to stderr")
    """
    runner = ProcessRunner(own_users=own_users)
    program = Program(
        {"main.py": textwrap.dedent(code), "pkg/helper.txt": "héllo"},
        ["python3", "main.py"],
        stdin="line one\nline two\n",
    )
    outcome = runner.run(program, LIMITS)
    assert outcome.verdict is Verdict.COMPLETED, outcome
    lines = outcome.text().splitlines()
    assert lines[:3] == ["LINE ONE", "LINE TWO", "héllo"]
    # Nothing of the caller's environment leaks through.
    assert lines[3] == str(
        sorted(
            [
                "DEW_SANDBOX_JOB",
                "HOME",
                "LANG",
                "LC_ALL",
                "PATH",
                "PYTHONDONTWRITEBYTECODE",
                "PYTHONUNBUFFERED",
                "TMPDIR",
            ]
        )
    )
    assert lines[4] == "True"
    assert outcome.stderr == b"to stderr"


@pytest.mark.parametrize("own_users", MODES)
def test_output_is_cut_at_the_cap(own_users: bool) -> None:
    limits = SandboxLimits(deadline_seconds=5, output_bytes=1000)
    outcome = run(
        "import sys\nsys.stdout.write('a' * 600)\nsys.stderr.write('b' * 600)\n",
        own_users=own_users,
        limits=limits,
    )
    assert outcome.verdict is Verdict.OUTPUT_LIMIT
    assert len(outcome.stdout) + len(outcome.stderr) == 1000
    exact = run("import sys\nsys.stdout.write('a' * 1000)\n", own_users=own_users, limits=limits)
    assert exact.verdict is Verdict.COMPLETED and exact.stdout == b"a" * 1000


@pytest.mark.parametrize("own_users", MODES)
def test_address_space_limit(own_users: bool) -> None:
    limits = SandboxLimits(deadline_seconds=5, address_space_bytes=200 << 20)
    outcome = run("x = bytearray(400 << 20)\n", own_users=own_users, limits=limits)
    assert outcome.verdict is Verdict.FAILED
    assert b"MemoryError" in outcome.stderr
    fits = run("x = bytearray(50 << 20)\nprint(len(x))\n", own_users=own_users, limits=limits)
    assert fits.verdict is Verdict.COMPLETED and fits.text().strip() == str(50 << 20)


@pytest.mark.parametrize("own_users", MODES)
def test_no_core_dumps_and_rlimits_seen_inside(own_users: bool) -> None:
    code = """
        import resource
        print(resource.getrlimit(resource.RLIMIT_CORE))
        print(resource.getrlimit(resource.RLIMIT_CPU))
        print(resource.getrlimit(resource.RLIMIT_AS))
        print(open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0])
    """
    outcome = run(code, own_users=own_users)
    assert outcome.text().splitlines() == [
        "(0, 0)",
        str(LIMITS.cpu_rlimit),
        str((LIMITS.address_space_bytes,) * 2),
        "1",
    ]


@pytest.mark.parametrize("own_users", MODES)
def test_forked_child_dies_at_the_timeout(own_users: bool, tmp_path) -> None:
    mark = f"dew-forked-{os.getpid()}-{own_users}"
    code = """
        import os, sys, time
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
        time.sleep(60)
    """
    outcome = run(
        code,
        own_users=own_users,
        argv_extra=(mark,),
        limits=SandboxLimits(cpu_seconds=1, deadline_seconds=1),
    )
    assert outcome.verdict is Verdict.TIMEOUT
    assert processes_with(mark) == []


@pytest.mark.parametrize("own_users", MODES)
def test_a_command_that_cannot_start_is_a_failed_outcome(own_users: bool) -> None:
    runner = ProcessRunner(own_users=own_users)
    outcome = runner.run(Program({}, ["no-such-command-dew"]), LIMITS)
    assert outcome.verdict is Verdict.FAILED
    assert outcome.exit_code is None
    assert b"could not start" in outcome.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="own uids need root")
def test_own_users_are_fresh_and_cannot_touch_the_caller(tmp_path) -> None:
    code = """
        import os
        print(os.getuid(), os.getgid(), os.getgroups())
        try:
            os.kill(os.getppid(), 0)
            print("can signal parent")
        except PermissionError:
            print("cannot signal parent")
    """
    first = run(code, own_users=True).text().splitlines()
    second = run(code, own_users=True).text().splitlines()
    uid, gid, groups = first[0].split(" ", 2)
    assert int(uid) >= 1_900_000_000 and uid == gid and groups == "[]"
    assert first[0] != second[0]
    assert first[1] == "cannot signal parent"


def test_job_directories_are_removed() -> None:
    before = sandbox_temp_dirs()
    for own_users in MODES:
        run(
            "open('scratch.txt', 'w').write('x')\nimport os\nos.mkdir('sub')\n", own_users=own_users
        )
    assert sandbox_temp_dirs() - before == set()


PARENT = """
import sys
from dew.sandbox import Program, ProcessRunner, SandboxLimits
code = "import os, sys, time\\nopen(sys.argv[1], 'w').write(str(os.getpid()))\\ntime.sleep(60)\\n"
runner = ProcessRunner(own_users={own_users})
runner.run(Program({{"main.py": code}}, ["python3", "main.py", sys.argv[1]]),
           SandboxLimits(deadline_seconds=60, cpu_seconds=60))
"""


@pytest.mark.parametrize("own_users", MODES)
def test_program_dies_with_its_parent(own_users: bool) -> None:
    # A directory every sandbox uid can reach (pytest's tmp_path is private to root).
    shared = pathlib.Path(tempfile.mkdtemp(prefix="dew-test-shared-"))
    shared.chmod(0o777)
    pid_file = shared / "pid"
    dirs_before = sandbox_temp_dirs()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(own_users=own_users), str(pid_file)]
    )
    try:
        end = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < end, "the program never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert os.path.exists(f"/proc/{child}")
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}"):
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            assert time.monotonic() < end, "the program outlived its parent"
            time.sleep(0.02)
    finally:
        parent.kill()
        parent.wait()
        shutil.rmtree(shared)
        # A SIGKILLed parent cannot remove its job directory: the test does.
        for name in sandbox_temp_dirs() - dirs_before:
            shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)


def test_own_users_needs_root() -> None:
    if os.geteuid() == 0:
        assert ProcessRunner().own_users is True
    else:
        with pytest.raises(PermissionError, match="own_users"):
            ProcessRunner(own_users=True)


@pytest.mark.parametrize("own_users", MODES)
def test_spawn_and_reap_a_long_lived_worker(own_users: bool) -> None:
    # The building blocks for a worker spoken to line by line (a JSON-lines environment).
    from dew.sandbox.launcher import new_marker, reap, sandbox_environment, spawn

    shared = pathlib.Path(tempfile.mkdtemp(prefix="dew-test-shared-"))
    shared.chmod(0o755)
    uid = 1_900_000_000 + os.getpid() % 1000 if own_users else None
    marker = new_marker()
    worker = (
        "import json, os, sys\n"
        "if os.fork() == 0:\n"  # a helper that would outlive the worker without reap()
        "    import time; time.sleep(60)\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    print(json.dumps({'echo': msg['n'] * 2}), flush=True)\n"
    )
    proc = spawn(
        ["python3", "-c", worker, marker],
        cwd=str(shared),
        env=sandbox_environment(str(shared), marker),
        limits=LIMITS,
        uid=uid,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for n in (1, 2, 3):
            proc.stdin.write(f'{{"n": {n}}}\n'.encode())
            proc.stdin.flush()
            assert proc.stdout.readline() == f'{{"echo": {2 * n}}}\n'.encode()
        assert len(processes_with(marker)) == 2
    finally:
        usage = reap(proc, uid=uid, marker=marker)
        shutil.rmtree(shared)
    assert proc.returncode == -signal.SIGKILL
    assert usage.ru_utime >= 0
    assert processes_with(marker) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="own uids need root")
def test_a_temp_root_closed_to_sandbox_users_is_refused(tmp_path) -> None:
    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    closed.chmod(0o700)
    with pytest.raises(ValueError, match=r"ProcessRunner\.temp_root: .*closed"):
        ProcessRunner(temp_root=str(closed / "inner"))
    opened = pathlib.Path(tempfile.mkdtemp(prefix="dew-test-root-"))
    try:
        opened.chmod(0o755)
        runner = ProcessRunner(temp_root=str(opened))
        outcome = runner.run(
            Program({"main.py": "import os; print(os.getcwd())"}, ["python3", "main.py"]), LIMITS
        )
        assert outcome.text().startswith(str(opened) + "/dew-sandbox-")
        assert list(opened.iterdir()) == []
    finally:
        shutil.rmtree(opened)

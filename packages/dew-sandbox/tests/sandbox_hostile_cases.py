"""The hostile suite: adversarial programs, each with the verdict it must get.

Every program is ``python3 main.py <MARK> ...``; the mark stays in the command line of
every process the program forks (and the programs pass it on when they exec), so after a
run a /proc scan finds anything that survived. Host-side effects are checked per case:
a file written outside the job directory, a host secret read, a host TCP port reached.

Expected verdicts can differ by runner ("process" / "container"): a memory bomb hits
RLIMIT_AS in a process (MemoryError, FAILED) but the memory cgroup in a container (OOM
kill, CRASHED); the process runner keeps the host network by design, so reaching the
host port is an escape only in a container.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from dew.sandbox import Outcome, Program, SandboxLimits, Verdict

C, F, T, X, OUT = (
    Verdict.COMPLETED,
    Verdict.FAILED,
    Verdict.TIMEOUT,
    Verdict.CRASHED,
    Verdict.OUTPUT_LIMIT,
)

# Small limits keep the suite to seconds on two shared cores.
LIMITS = SandboxLimits(
    cpu_seconds=1.0,
    deadline_seconds=2.0,
    address_space_bytes=192 << 20,
    memory_bytes=96 << 20,
    output_bytes=64 << 10,
    processes=32,
    file_bytes=4 << 20,
    tmpfs_bytes=16 << 20,
)


@dataclasses.dataclass
class HostContext:
    """Host-side things the programs try to reach."""

    mark: str
    outside_dir: str  # root-owned 0755 directory on the host
    secret_path: str  # root-owned 0600 file on the host
    secret: str
    port: int  # a TCP listener on 127.0.0.1 in the test process


Check = Callable[[Outcome, HostContext, str], "str | None"]


@dataclasses.dataclass
class Case:
    name: str
    code: str
    expected: dict[str, set[Verdict]]
    check: Check | None = None
    extra_argv: tuple[str, ...] = ()
    stdin: bytes = b""
    # Runs alone: it takes every core it can reach, which would starve its neighbours
    # into false timeouts (the process runner has no cgroup to share CPU fairly).
    solo: bool = False

    def program(self, ctx: HostContext) -> Program:
        code = self.code.format(
            outside=os.path.join(ctx.outside_dir, f"{self.name}.txt"),
            secret=ctx.secret_path,
            port=ctx.port,
        )
        argv = ["python3", "main.py", f"{ctx.mark}-{self.name}", *self.extra_argv]
        return Program({"main.py": code}, argv, stdin=self.stdin)


def both(*verdicts: Verdict) -> dict[str, set[Verdict]]:
    return {"process": set(verdicts), "container": set(verdicts)}


def _stdout_is(text: str) -> Check:
    def check(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
        got = outcome.text().strip()
        return None if got == text else f"stdout {got[:60]!r}, expected {text!r}"

    return check


def _no_outside_file(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
    path = os.path.join(ctx.outside_dir, "write_outside_job_dir.txt")
    return f"wrote {path}" if os.path.exists(path) else None


def _no_secret(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
    return "read the host secret" if ctx.secret.encode() in outcome.stdout else None


def _no_network_in_container(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
    if kind == "container" and b"connected" in outcome.stdout:
        return "reached a host TCP port from a container"
    if b"connected" not in outcome.stdout and b"blocked" not in outcome.stdout:
        return f"the probe did not report: {outcome.stdout[:80]!r} {outcome.stderr[-200:]!r}"
    return None


def _parent_untouched(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
    # The process runner's parent is the test process: the kill must be refused (it
    # would not be here to check otherwise). A container's parent is its init, which
    # the kernel shields from signals sent inside its namespace.
    allowed = {"blocked"} if kind == "process" else {"blocked", "sent"}
    got = outcome.text().strip()
    return None if got in allowed else f"stdout {got!r}, expected one of {sorted(allowed)}"


def _quick(outcome: Outcome, ctx: HostContext, kind: str) -> str | None:
    # A child holding the pipes open must not keep the program running to the deadline.
    limit = 0.75 * LIMITS.deadline_seconds
    return None if outcome.seconds < limit else f"took {outcome.seconds:.2f} s"


# A child that keeps the mark when it replaces itself with a fresh interpreter.
_REEXEC = (
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', sys.argv[1]])"
)

CASES: list[Case] = [
    Case(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        both(T),
        solo=True,
    ),
    Case(
        "memory_bomb",
        "blocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))\n",
        {"process": {F}, "container": {X}},
    ),
    Case("cpu_spin", "while True:\n    pass\n", both(T)),
    Case(
        "sleep_ignoring_sigterm",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n",
        both(T),
    ),
    Case(
        "spin_ignoring_sigxcpu",
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n",
        both(T),
    ),
    Case(
        "raise_own_limits_then_spin",
        "import resource\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY,) * 2)\n"
        "except (ValueError, OSError):\n"
        "    pass\n"
        "while True:\n    pass\n",
        both(T),
    ),
    Case(
        "double_forked_daemon",
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('parent done')\n",
        both(C),
        _stdout_is("parent done"),
    ),
    Case(
        "daemon_that_execs",
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.closerange(0, 3)\n"
        f"        {_REEXEC}\n"
        "    os._exit(0)\n",
        both(C),
    ),
    Case(
        "setsid_escape_holding_pipes",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('bye')\n",
        both(C),
        _quick,
    ),
    Case(
        "sleep_past_deadline_in_child",
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    time.sleep(60)\n"
        "os.wait()\n",
        both(T),
    ),
    Case(
        "stdout_flood",
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
        both(OUT),
    ),
    Case(
        "stderr_flood",
        "import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n",
        both(OUT),
    ),
    Case(
        "flood_from_children",
        "import os\nfor _ in range(4):\n    os.fork()\nwhile True:\n    os.write(1, b'z' * 4096)\n",
        both(OUT),
    ),
    Case(
        "close_stdout_then_spin",
        "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass\n",
        both(T),
    ),
    Case(
        "write_outside_job_dir",
        "try:\n"
        "    with open({outside!r}, 'w') as f:\n"
        "        f.write('escaped')\n"
        "    print('wrote')\n"
        "except OSError:\n"
        "    print('blocked')\n",
        both(C),
        _no_outside_file,
    ),
    Case(
        "read_host_secret",
        "try:\n    print(open({secret!r}).read())\nexcept OSError:\n    print('blocked')\n",
        both(C),
        _no_secret,
    ),
    Case(
        "network_connection",
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', {port}), timeout=0.5).close()\n"
        "    print('connected')\n"
        "except OSError:\n"
        "    print('blocked')\n",
        both(C),
        _no_network_in_container,
    ),
    Case("huge_argv", "print('started')\n", both(F), extra_argv=("A" * 1000,) * 3000),
    Case(
        "huge_stdin_read",
        "import sys\nprint(len(sys.stdin.buffer.read()))\n",
        both(C),
        _stdout_is(str(8 << 20)),
        stdin=b"s" * (8 << 20),
    ),
    Case("huge_stdin_ignored", "print('ignored')\n", both(C), stdin=b"i" * (8 << 20)),
    Case(
        "zombie_making_parent",
        "import os, time\n"
        "for _ in range(20):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('zombies left')\n",
        both(C),
        _stdout_is("zombies left"),
    ),
    Case(
        "kill_own_process_group",
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(30)\n"
        "os.killpg(0, signal.SIGKILL)\n",
        both(X),
    ),
    Case(
        "kill_every_process_it_can",
        "import os, signal\n"
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        "print('still here')\n",
        both(C),
        _stdout_is("still here"),
    ),
    Case(
        "kill_parent",
        "import os, signal\n"
        "try:\n    os.kill(os.getppid(), signal.SIGKILL)\n    print('sent')\n"
        "except OSError:\n    print('blocked')\n",
        both(C),
        _parent_untouched,
    ),
    Case("segfault", "import ctypes\nctypes.string_at(0)\n", both(X)),
    Case("abort", "import os\nos.abort()\n", both(X)),
    Case("nonzero_exit", "import sys\nprint('partial')\nsys.exit(7)\n", both(F)),
    Case(
        "huge_file",
        "import os\n"
        "with open(os.path.join(os.environ['TMPDIR'], 'big'), 'wb') as f:\n"
        "    for _ in range(64):\n"
        "        f.write(b'f' * (1 << 20))\n",
        both(F),  # CPython ignores SIGXFSZ, so the write fails with EFBIG instead
    ),
    Case(
        "thread_bomb",
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 10000:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "        n += 1\n"
        "except (RuntimeError, MemoryError):\n"
        "    pass\n"
        "print('capped' if n < 10000 else 'uncapped')\n",
        both(C),
        _stdout_is("capped"),
    ),
]

"""The local process launcher shared by every runner that starts host processes.

:func:`launch` starts an argv in a directory under :class:`SandboxLimits` and returns an
:class:`Outcome`. What it guarantees:

* In the child, before ``exec``: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, no core dumps
  (RLIMIT_CORE 0), a new session and process group, no-new-privileges (set-uid
  executables do not raise privileges), ``PR_SET_PDEATHSIG`` = SIGKILL
  (set through ``prctl`` via ctypes) followed by a check that ``getppid()`` is still the
  launching process (the parent may have died between ``fork`` and ``prctl``), and a
  minimal environment (:func:`sandbox_environment`).
* In the parent: stdin is fed without blocking, stdout and stderr are read with a cap on
  both together, and the program's process group is SIGKILLed at the wall deadline, as
  soon as the cap is passed, when a cancel event is set, and after the program exits
  (so a child it left behind dies with it).
* When the parent is root and a ``uid`` is given, the program runs under that otherwise
  unused user id (group id the same, no supplementary groups) with RLIMIT_NPROC, which
  is per user, as its process cap. Leaving the process group (``setsid``, a double
  fork) then does not help an escapee: after the program, a helper that switches to the
  same uid calls ``kill(-1, SIGKILL)``, which reaches every process of that uid, until
  none is left (checked in /proc).
* Without root, an environment marker (``DEW_SANDBOX_JOB``) is the fallback: after the
  program, processes of the caller's user whose initial environment carries it are
  killed. A process that rewrites its environment and leaves the process group can
  evade that; run untrusted code in :class:`~dew.sandbox.ContainerRunner`.

Edge cases: a program that cannot be started (missing command, argv too large) is a
``FAILED`` outcome with ``exit_code`` None and the error on stderr. ``PR_SET_PDEATHSIG``
fires when the *thread* that forked the child exits, so launch from a thread that
outlives the program (the fleet's worker threads do).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from dew.sandbox._pipes import Pipes, closing_selector
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome, Verdict
from dew.sandbox.runner import CancelFlag
from dew.sandbox.sweep import (
    MARKER_VARIABLE,
    kill_group,
    kill_marked,
    kill_user,
    live_processes_of_user,
    marked_processes,
)

__all__ = [
    "MARKER_VARIABLE",
    "SandboxCancelled",
    "kill_marked",
    "kill_user",
    "launch",
    "live_processes_of_user",
    "marked_processes",
    "reap",
    "sandbox_environment",
    "spawn",
]

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


class SandboxCancelled(Exception):
    """Raised by a runner when its cancel event stopped a program (after cleaning up)."""


def sandbox_environment(home: str, marker: str) -> dict[str, str]:
    """The whole environment a program sees: PATH, locale, HOME/TMPDIR and the job marker."""
    return {
        "PATH": SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        MARKER_VARIABLE: marker,
    }


def new_marker() -> str:
    """A fresh random job marker."""
    return "dew-" + secrets.token_hex(12)


def _make_preexec(limits: SandboxLimits, parent_pid: int, own_user: bool) -> Callable[[], None]:
    cpu = limits.cpu_rlimit
    address = limits.address_space_bytes
    fsize = limits.file_bytes
    nproc = limits.processes

    def preexec() -> None:  # runs in the child between fork and exec: syscalls only
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, cpu)
        resource.setrlimit(resource.RLIMIT_AS, (address, address))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if own_user:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        # No set-uid/set-gid executable can raise the program's privileges.
        _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        # Popen switched the user already; the kernel clears the death signal on a
        # credential change, so it is set here, after it.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _failed_to_start(error: OSError, started: float) -> Outcome:
    message = f"sandbox: could not start the program: {error}\n".encode()
    return Outcome(Verdict.FAILED, None, b"", message, time.monotonic() - started)


def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    limits: SandboxLimits,
    uid: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with the launcher's child-side setup; stdin/stdout/stderr are pipes.

    The building block of :func:`launch`, for callers that talk to a long-lived worker
    (a JSON-lines environment, say): the rlimits, session, no-new-privileges, parent-death
    signal and parent check are applied, and ``uid`` (root only) switches user and group.
    The wall deadline and output cap are the caller's to keep; :func:`reap` ends it.

    Raises:
        OSError: the program could not be started (missing command, argv too large).
        subprocess.SubprocessError: the child-side setup failed.
    """
    own_user = uid is not None
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_make_preexec(limits, os.getpid(), own_user),
        close_fds=True,
        user=uid,
        group=uid,
        extra_groups=[] if own_user else None,
        umask=0o077,
    )


def reap(
    proc: subprocess.Popen[bytes], *, uid: int | None = None, marker: str | None = None
) -> resource.struct_rusage:
    """Kill what :func:`spawn` started and everything it left, reap it, close its pipes.

    SIGKILL goes to the process group (whose leader is still unreaped here, so the id is
    not reused), then the leader is reaped, then every process of ``uid`` (or, without a
    uid, every process carrying ``marker``) is killed. Sets ``proc.returncode`` and
    returns the leader's resource usage.
    """
    kill_group(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if uid is not None:
        kill_user(uid)
    elif marker is not None:
        kill_marked(marker)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return usage


def launch(
    argv: Sequence[str],
    *,
    cwd: str,
    stdin: bytes,
    limits: SandboxLimits,
    env: Mapping[str, str],
    uid: int | None = None,
    marker: str | None = None,
    cancel: CancelFlag | None = None,
) -> Outcome:
    """Run ``argv`` in ``cwd`` under ``limits`` and return its :class:`Outcome`.

    Args:
        argv: command and arguments, no shell.
        cwd: working directory (the job directory).
        stdin: fed to the program, then closed.
        limits: see :class:`SandboxLimits`.
        env: the complete environment (see :func:`sandbox_environment`).
        uid: run as this user and group id (the parent must be root); its processes are
            all killed after the program. None keeps the caller's user.
        marker: the value of ``DEW_SANDBOX_JOB`` in ``env``; processes carrying it are
            killed after the program when ``uid`` is None.
        cancel: when set, the program is killed and :class:`SandboxCancelled` raised.

    Raises:
        SandboxCancelled: the cancel event stopped the program (already cleaned up).
    """
    own_user = uid is not None
    if own_user and os.geteuid() != 0:
        raise PermissionError(f"launch: uid={uid} needs a root parent, running as {os.geteuid()}")
    started = time.monotonic()
    deadline = started + limits.deadline_seconds
    try:
        proc = spawn(argv, cwd=cwd, env=env, limits=limits, uid=uid)
    except OSError as error:
        return _failed_to_start(error, started)
    except subprocess.SubprocessError as error:
        return _failed_to_start(OSError(errno.ECHILD, str(error)), started)

    pidfd = _pidfd(proc.pid)
    try:
        with closing_selector() as selector:
            pipes = Pipes(proc, selector, stdin, limits.output_bytes, pidfd)
            pipes.register()
            timed_out, cancelled = pipes.serve(deadline, cancel)
            # Whatever ended the loop, the whole group goes now (the leader is still
            # unreaped, so the group id cannot have been reused).
            kill_group(proc.pid)
            pipes.drain(uid, marker)
    finally:
        usage = reap(proc, uid=uid, marker=marker)
        if pidfd is not None:
            os.close(pidfd)
    seconds = time.monotonic() - started
    if cancelled:
        raise SandboxCancelled("the program was cancelled")
    code = proc.returncode
    cpu_used = usage.ru_utime + usage.ru_stime
    verdict = _verdict(code, timed_out, pipes.capture.over_cap, cpu_used, limits)
    return Outcome(verdict, code, pipes.output(pipes.out_fd), pipes.output(pipes.err_fd), seconds)


def _verdict(
    code: int, timed_out: bool, over_cap: bool, cpu_used: float, limits: SandboxLimits
) -> Verdict:
    if over_cap:
        return Verdict.OUTPUT_LIMIT
    if timed_out:
        return Verdict.TIMEOUT
    if code == -signal.SIGXCPU:
        return Verdict.TIMEOUT
    if code == -signal.SIGKILL and cpu_used >= limits.cpu_rlimit[1] - 0.05:
        return Verdict.TIMEOUT  # the hard RLIMIT_CPU (the program ignored SIGXCPU)
    if code < 0:
        return Verdict.CRASHED
    return Verdict.COMPLETED if code == 0 else Verdict.FAILED

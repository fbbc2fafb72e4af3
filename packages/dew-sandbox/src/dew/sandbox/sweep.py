"""Killing what a sandboxed host program left: its process group, its uid or its marker.

:func:`kill_group` signals a process group, :func:`kill_user` every process of a uid (the
launcher's root mode) and :func:`kill_marked` every process whose initial environment
carries the job marker ``DEW_SANDBOX_JOB`` (the fallback without root). The scans read
/proc; :mod:`dew.sandbox.launcher` calls them after each program.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
from collections.abc import Iterator

__all__ = [
    "MARKER_VARIABLE",
    "kill_group",
    "kill_marked",
    "kill_user",
    "live_processes_of_user",
    "marked_processes",
]

MARKER_VARIABLE = "DEW_SANDBOX_JOB"


def _proc_entries() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def live_processes_of_user(uid: int) -> list[int]:
    """Pids whose real uid is ``uid`` and that are not zombies (from /proc).

    A first pass compares the owner of ``/proc/<pid>`` (the effective uid; the same as
    the real one for sandboxed programs, which run with no-new-privileges), which is
    one ``stat`` per process; only matches get their status read.
    """
    found = []
    for pid in _proc_entries():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        real_uid = state = None
        for line in status.splitlines():
            if line.startswith(b"State:"):
                state = line.split()[1]
            elif line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
                break
        if real_uid == uid and state not in (b"Z", b"X"):
            found.append(pid)
    return found


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose initial environment holds ``DEW_SANDBOX_JOB=marker``."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for pid in _proc_entries():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\x00"):
            found.append(pid)
    return found


def kill_marked(marker: str, rounds: int = 50) -> bool:
    """SIGKILL every process carrying ``marker``; True when none is left."""
    for _ in range(rounds):
        pids = marked_processes(marker)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    return not marked_processes(marker)


def _kill_all_as(uid: int) -> None:
    """Fork a helper that becomes ``uid`` and sends SIGKILL to ``-1``.

    ``kill(-1, SIGKILL)`` from an unprivileged process reaches every process it may
    signal, i.e. every process of the same uid (the helper excepted), in one pass under
    the kernel's task-list lock, so a forking program cannot outrun it. Linux returns 0
    whenever any other process exists, so the caller checks /proc for survivors.
    """
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a threaded process; the child below makes
        # four system calls and exits, touching no lock another thread could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - child; only plain system calls
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def kill_user(uid: int, timeout: float = 5.0) -> bool:
    """Kill every live process of ``uid`` (needs root); True when none is left.

    Zombies are not counted: they hold no resources and go when their parent reaps them.
    """
    end = time.monotonic() + timeout
    # /proc lists pids in increasing order and a child gets a higher pid than its
    # parent, so a scan that finds nothing saw every process (short of pid wrap-around).
    # Most programs leave nothing, and then no helper is forked.
    while live_processes_of_user(uid):
        _kill_all_as(uid)
        if time.monotonic() > end:
            return not live_processes_of_user(uid)
        time.sleep(0.002)
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (gone or not ours: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)

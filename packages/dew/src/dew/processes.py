"""Child processes that can be stopped whole: start, wait until ready, stop.

The long-running children of ``dew`` and its satellites (a test's ranks, a harbor trial,
a server a test starts) go through here, so stopping one leaves nothing behind.
``dew.sandbox``, which imports no ``dew``, keeps its own.

- ``start(command, env=, cwd=, log=, error_log=)`` runs ``command`` in a session (and so a
  process group) of its own, with stdin from ``/dev/null``. ``log`` is where stdout goes: a
  path (the file is created or appended to, never truncated, so several runs of one
  command share it), an open binary file, or None for ``/dev/null``. stderr goes to
  ``error_log`` when given (same kinds), else to the same place as stdout. A path is opened
  only for the ``Popen`` call: the child keeps its own descriptor and the parent's is
  closed, so the caller holds no file. ``env`` is the child's whole environment (None: this
  process's), as with ``subprocess.Popen``.
- ``stop(process, grace=)`` sends SIGTERM to the child's group, waits up to ``grace``
  seconds for the child itself to exit, then sends SIGKILL to the group (whatever of it is
  still there: a grandchild that ignores SIGTERM, one the child left behind on exit) and
  reaps the child. It returns the child's exit status (negative: the signal that ended
  it). A child that exited already, reaped or not, is fine: its group still gets the
  SIGKILL, so nothing it started survives it. ``grace=0`` skips SIGTERM and kills at once.
  A group that is gone (``ProcessLookupError``) is no error. Calling it twice is harmless.
- ``running(command, ..., grace=)`` is ``start`` as a ``with`` block that ``stop``s the
  child when the block ends, normally or by an exception (``KeyboardInterrupt`` included).
- ``wait_ready(process, ready, timeout=, log=)`` calls ``ready()`` every ``interval``
  seconds until it returns True, and returns the seconds that took. It fails fast with
  ``ProcessExited`` when the child exits first, and raises ``TimeoutError`` when
  ``timeout`` seconds pass; both messages name the command, the exit status and the log
  (its path and last lines when ``log`` is a path). It never stops the child: use it
  inside ``running`` (or call ``stop``) so that a failed wait leaves nothing behind.
  An exception ``ready`` raises is not caught: return False for "not yet".
- ``describe(process, log)`` is that text (command, state, log tail) for callers' own
  messages.

POSIX only (process groups, ``killpg``). The group id is the child's pid, which the kernel
does not hand out again while any member of the group is alive, so the SIGKILL after the
child exited reaches only what the child started (as long as ``stop`` comes soon after the
exit: once the whole group is gone, the pid may in time name a new group).

This module imports only the standard library, so every part of ``dew`` may use it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: What ``start`` takes for ``log`` and ``error_log``: a path, an open binary file or None.
Target = str | os.PathLike[str] | IO[bytes] | None


class ProcessExited(RuntimeError):
    """The child exited while ``wait_ready`` waited for it to become ready."""


def _open(target: Target, stack: contextlib.ExitStack) -> Any:
    if target is None:
        return subprocess.DEVNULL
    if isinstance(target, (str, os.PathLike)):
        return stack.enter_context(open(target, "ab"))
    return target


def start(
    command: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: Target = None,
    error_log: Target = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a process group of its own (see the module docstring)."""
    with contextlib.ExitStack() as stack:
        out = _open(log, stack)
        err = subprocess.STDOUT if error_log is None else _open(error_log, stack)
        return subprocess.Popen(
            [os.fspath(part) for part in command],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )


def _signal_group(process: subprocess.Popen[Any], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop(process: subprocess.Popen[Any], grace: float = 10.0) -> int:
    """Stop the child and its whole group; its exit status (see the module docstring)."""
    if grace < 0:
        raise ValueError(f"grace: expected seconds >= 0, got {grace!r}")
    if grace > 0 and process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    _signal_group(process, signal.SIGKILL)
    return process.wait()


@contextlib.contextmanager
def running(
    command: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: Target = None,
    error_log: Target = None,
    grace: float = 10.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """``start`` the child for the ``with`` block and ``stop`` it when the block ends."""
    process = start(command, env=env, cwd=cwd, log=log, error_log=error_log)
    try:
        yield process
    finally:
        stop(process, grace)


def describe(process: subprocess.Popen[Any], log: Target = None, lines: int = 20) -> str:
    """The command, its state, and the log (path and last ``lines`` lines) for messages."""
    args = process.args
    if isinstance(args, (str, bytes, os.PathLike)):
        shown = os.fsdecode(args)
    else:
        shown = shlex.join(os.fsdecode(a) for a in args)
    code = process.poll()
    state = "still running" if code is None else f"exit status {code}"
    text = f"{shown} ({state})"
    if isinstance(log, (str, os.PathLike)):
        try:
            tail = Path(log).read_text(errors="replace").splitlines()[-lines:]
        except OSError as error:
            tail = [f"(unreadable: {error})"]
        text += f"; log {os.fspath(log)}, last lines:\n" + "\n".join(tail)
    return text


def wait_ready(
    process: subprocess.Popen[Any],
    ready: Callable[[], bool],
    timeout: float,
    *,
    log: Target = None,
    interval: float = 0.1,
) -> float:
    """Seconds until ``ready()`` held; fails fast when the child exits (module docstring)."""
    if not timeout > 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
    started = time.monotonic()
    deadline = started + float(timeout)
    while True:
        if process.poll() is not None:
            raise ProcessExited(f"exited before it was ready: {describe(process, log)}")
        if ready():
            return time.monotonic() - started
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not ready after {timeout:g} s: {describe(process, log)}")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


__all__ = ["ProcessExited", "Target", "describe", "running", "start", "stop", "wait_ready"]

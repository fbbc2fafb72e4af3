"""The parent's side of a launched program's pipes, on one selector: stdin fed without
blocking, stdout and stderr read under one byte cap, and the exit noticed through a pidfd (or
by polling). ``dew.sandbox.launcher.launch`` serves them until the program ends, kills its
group, then drains what the pipes still hold.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Iterator

from dew.sandbox.runner import CancelFlag
from dew.sandbox.sweep import kill_marked, kill_user

_CHUNK = 1 << 16


def exited(pid: int) -> bool:
    """True when the child has exited (it stays unreaped, so its pid cannot be reused)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


@contextlib.contextmanager
def closing_selector() -> Iterator[selectors.BaseSelector]:
    selector = selectors.DefaultSelector()
    try:
        yield selector
    finally:
        selector.close()


class Capture:
    """stdout and stderr buffers sharing one byte cap; bytes past the cap are counted, not kept."""

    def __init__(self, out_fd: int, err_fd: int, cap: int) -> None:
        self.buffers = {out_fd: bytearray(), err_fd: bytearray()}
        self.cap = cap
        self.total = 0

    @property
    def over_cap(self) -> bool:
        return self.total > self.cap

    def read(self, fd: int) -> bool:
        """Read what ``fd`` has; False at end of file (or when it has nothing yet: True)."""
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.buffers[fd] += chunk[: max(self.cap - self.total, 0)]
        self.total += len(chunk)
        return True


class Pipes:
    """One program's pipes on one selector: the stdin still to write and the outputs still open."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        selector: selectors.BaseSelector,
        stdin: bytes,
        cap: int,
        pidfd: int | None,
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.selector = selector
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.capture = Capture(self.out_fd, self.err_fd, cap)
        self.stdin_fd = proc.stdin.fileno()
        self.pidfd = pidfd
        self.pending = memoryview(stdin)
        self.open_outputs = 0

    def output(self, fd: int) -> bytes:
        """What was kept of the output ``fd``."""
        return bytes(self.capture.buffers[fd])

    def register(self) -> None:
        """Put the outputs, the stdin (closed at once when empty) and the pidfd on the selector."""
        assert self.proc.stdin is not None
        for fd in self.capture.buffers:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
        if self.pending:
            os.set_blocking(self.stdin_fd, False)
            self.selector.register(self.stdin_fd, selectors.EVENT_WRITE)
        else:
            self.proc.stdin.close()
        if self.pidfd is not None:
            self.selector.register(self.pidfd, selectors.EVENT_READ)
        self.open_outputs = len(self.capture.buffers)

    def serve(self, deadline: float, cancel: CancelFlag | None) -> tuple[bool, bool]:
        """Serve the pipes until the program exits, the cap, the deadline or a cancel:
        ``(timed_out, cancelled)``."""
        while True:
            now = time.monotonic()
            if now >= deadline:
                return True, False
            if cancel is not None and cancel.is_set():
                return False, True
            # With a pidfd the exit wakes the selector; otherwise poll every 20 ms.
            wait = min(deadline - now, 0.05 if self.pidfd is not None else 0.02)
            if self.open_outputs == 0 and self.pidfd is None:
                wait = min(wait, 0.002)
            ended = self._select(wait)
            if self.capture.over_cap:
                return False, False
            no_wake = self.pidfd is None or self.open_outputs == 0
            if ended or (no_wake and exited(self.proc.pid)):
                return False, False

    def _select(self, wait: float) -> bool:
        """One select: write stdin, read the outputs; True when the pidfd reports the exit."""
        ended = False
        for key, _ in self.selector.select(wait):
            fd = key.fd
            if fd == self.pidfd:
                ended = True
            elif fd == self.stdin_fd:
                self._write_stdin(fd)
            elif not self.capture.read(fd):
                self.selector.unregister(fd)
                self.open_outputs -= 1
        return ended

    def _write_stdin(self, fd: int) -> None:
        """Write the next chunk of stdin; close it once all is written or the program closed it."""
        assert self.proc.stdin is not None
        try:
            written = os.write(fd, self.pending[:_CHUNK])
            self.pending = self.pending[written:]
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin
            self.pending = self.pending[:0]
        if not self.pending:
            self.selector.unregister(fd)
            self.proc.stdin.close()

    def drain(self, uid: int | None, marker: str | None) -> None:
        """After the group kill, read what the program wrote before it ended, for at most 1 s.

        A process that escaped the group kill could hold a pipe open: once the pipes go quiet,
        sweep the sandbox uid (or the marked processes), then wait a bounded time.
        """
        for registered in list(self.selector.get_map().values()):
            if registered.fd not in self.capture.buffers:  # the pidfd, an unfinished stdin
                self.selector.unregister(registered.fd)
        swept = uid is None and marker is None
        drain_end = time.monotonic() + 1.0
        while self.open_outputs and not self.capture.over_cap and time.monotonic() < drain_end:
            events = self.selector.select(0.01 if not swept else 0.05)
            if not events and not swept:
                if uid is not None:
                    kill_user(uid)
                elif marker is not None:
                    kill_marked(marker)
                swept = True
            for key, _ in events:
                if not self.capture.read(key.fd):
                    self.selector.unregister(key.fd)
                    self.open_outputs -= 1

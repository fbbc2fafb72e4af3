"""SandboxFleet: many programs through one runner on a pool of threads."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Iterable
from types import TracebackType

from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome
from dew.sandbox.program import Program
from dew.sandbox.runner import CancelFlag, Runner

__all__ = ["SandboxFleet"]


class _Either:
    """Set when any flag is set (the fleet closing, one ``run`` call giving up, or the
    caller's own cancel)."""

    def __init__(self, *flags: CancelFlag | None) -> None:
        self._flags = [flag for flag in flags if flag is not None]

    def is_set(self) -> bool:
        return any(flag.is_set() for flag in self._flags)


class SandboxFleet:
    """Runs programs through ``runner`` on ``workers`` threads, one process/container each.

    ``run`` returns one :class:`Outcome` per program, in the order given. It may be
    called from several threads at once. If the calling thread is interrupted while it
    waits (KeyboardInterrupt, an asynchronous exception), its programs that have not
    started are dropped and the running ones are killed and cleaned up before the
    exception propagates. ``run(programs, cancel=flag)`` does the same once ``flag`` (anything
    with ``is_set()``, polled while the programs run) is set, and raises the runner's
    :class:`~dew.sandbox.launcher.SandboxCancelled`. ``close`` (or leaving a ``with`` block)
    does the same for every call and then closes the runner, so no process, container or
    job directory is left.

    Args:
        runner: a :class:`~dew.sandbox.ProcessRunner`, :class:`~dew.sandbox.ContainerRunner`
            or anything with the :class:`~dew.sandbox.runner.Runner` interface. The fleet
            owns it and closes it.
        limits: applied to every program.
        workers: threads, i.e. programs running at once (>= 1).
    """

    def __init__(self, runner: Runner, limits: SandboxLimits | None = None, workers: int = 1):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"SandboxFleet.workers: expected an integer >= 1, got {workers!r}")
        if limits is None:
            limits = SandboxLimits()
        if not isinstance(limits, SandboxLimits):
            raise TypeError(
                f"SandboxFleet.limits: expected SandboxLimits, got {type(limits).__name__}"
            )
        self.runner = runner
        self.limits = limits
        self.workers = workers
        self._closing = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="dew-sandbox"
        )
        self._lock = threading.Lock()
        self._closed = False

    def run(self, programs: Iterable[Program], cancel: CancelFlag | None = None) -> list[Outcome]:
        """Run every program; the outcomes come back in the programs' order. Once ``cancel``
        is set, the programs are stopped and ``SandboxCancelled`` is raised."""
        programs = list(programs)
        for i, program in enumerate(programs):
            if not isinstance(program, Program):
                raise TypeError(
                    f"SandboxFleet.run: programs[{i}]: expected Program, got "
                    f"{type(program).__name__}"
                )
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise TypeError(f"SandboxFleet.run: cancel: expected None or an object with "
                            f"is_set(), got {type(cancel).__name__}")  # fmt: skip
        given_up = threading.Event()
        stop = _Either(self._closing, given_up, cancel)
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxFleet.run: the fleet is closed")
            futures = [
                self._pool.submit(self.runner.run, program, self.limits, stop)
                for program in programs
            ]
        try:
            return [future.result() for future in futures]
        except BaseException:
            given_up.set()
            # Drop what has not started; wait for the running ones to kill and clean up.
            # (concurrent.futures.wait would hang on futures that close() cancelled:
            # they never reach the "cancelled and notified" state it waits for.)
            for future in futures:
                if not future.cancel():
                    with contextlib.suppress(concurrent.futures.CancelledError):
                        future.exception()
            if self._closing.is_set():
                raise RuntimeError("SandboxFleet.run: the fleet was closed") from None
            raise

    def close(self) -> None:
        """Stop every program still running, wait for the workers, close the runner."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self.runner.close()

    def __enter__(self) -> SandboxFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SandboxFleet({self.runner!r}, workers={self.workers})"

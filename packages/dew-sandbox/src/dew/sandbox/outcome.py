"""What running a program produced: a verdict, its exit code, its output and its time."""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["Outcome", "Verdict"]


class Verdict(enum.Enum):
    """How a program ended.

    COMPLETED: exited with status 0.
    FAILED: exited with a non-zero status, or could not be started at all (then
        ``exit_code`` is None and stderr says why).
    TIMEOUT: passed the wall deadline or used up its CPU seconds.
    CRASHED: killed by a signal it did not get from the sandbox's clocks (SIGSEGV,
        SIGABRT, SIGKILL from a memory cgroup, a SIGKILL it sent itself, ...).
    OUTPUT_LIMIT: wrote more than the output cap on stdout and stderr together.
    """

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OUTPUT_LIMIT = "output_limit"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one program; a failure is an Outcome, never an exception.

    Attributes:
        verdict: see :class:`Verdict`.
        exit_code: the exit status; negative ``-N`` when killed by signal N (the
            ``subprocess`` convention, also used for containers); None when the program
            never started.
        stdout: captured standard output, cut at the output cap.
        stderr: captured standard error, cut at the output cap.
        seconds: wall time from start until the program and everything it spawned
            were gone.
    """

    verdict: Verdict
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the verdict is COMPLETED."""
        return self.verdict is Verdict.COMPLETED

    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", errors="replace")

"""Resource limits applied to every sandboxed program.

One frozen value type, :class:`SandboxLimits`, shared by both runners. The process
runner turns it into POSIX rlimits in the child plus a wall clock and an output cap
kept by the parent; the container runner turns it into the engine's cgroup settings
(memory, CPU shares, pids) and ulimits.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["SandboxLimits"]


def _check_positive(name: str, value: float, *, integer: bool) -> None:
    kind = "a positive integer" if integer else "a positive finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SandboxLimits.{name}: expected {kind}, got {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise TypeError(f"SandboxLimits.{name}: expected {kind}, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"SandboxLimits.{name}: expected {kind}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """How much one program may use before it is stopped.

    Attributes:
        cpu_seconds: CPU time (RLIMIT_CPU, rounded up to whole seconds). A program that
            uses it up receives SIGXCPU and is reported as ``TIMEOUT``, like one that
            passes the wall deadline.
        deadline_seconds: wall-clock time from start; past it the whole program (its
            process group, and every process of its sandbox user) is killed.
        address_space_bytes: RLIMIT_AS, the virtual memory of each process. Runtimes
            reserve address space generously, so keep it well above the resident size
            you expect (a bare CPython needs about 30 MB).
        memory_bytes: resident memory of the whole container (cgroup limit, swap
            included); the process runner has no cgroup and relies on
            ``address_space_bytes``.
        output_bytes: cap on stdout and stderr together; one byte more and the program
            is killed with verdict ``OUTPUT_LIMIT``. The captured text is cut at the cap.
        processes: processes and threads the program may hold at once (container pids
            limit; for the process runner RLIMIT_NPROC, enforced only when it runs
            programs under their own user id, i.e. when the parent is root).
        file_bytes: largest file a process may write (RLIMIT_FSIZE; SIGXFSZ past it).
        cpu_shares: relative CPU weight of a container (1024 is the engine's default).
        tmpfs_bytes: size of the writable ``/tmp`` inside a container.
    """

    cpu_seconds: float = 5.0
    deadline_seconds: float = 10.0
    address_space_bytes: int = 1 << 30
    memory_bytes: int = 256 << 20
    output_bytes: int = 1 << 20
    processes: int = 64
    file_bytes: int = 64 << 20
    cpu_shares: int = 512
    tmpfs_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "deadline_seconds"):
            _check_positive(name, getattr(self, name), integer=False)
        for name in (
            "address_space_bytes",
            "memory_bytes",
            "output_bytes",
            "processes",
            "file_bytes",
            "cpu_shares",
            "tmpfs_bytes",
        ):
            _check_positive(name, getattr(self, name), integer=True)
        if self.memory_bytes < 6 << 20:
            raise ValueError(
                f"SandboxLimits.memory_bytes: expected at least 6 MiB (the engine's floor), "
                f"got {self.memory_bytes}"
            )

    @property
    def cpu_rlimit(self) -> tuple[int, int]:
        """(soft, hard) RLIMIT_CPU in whole seconds: SIGXCPU at soft, SIGKILL one second on."""
        soft = max(1, math.ceil(self.cpu_seconds))
        return soft, soft + 1

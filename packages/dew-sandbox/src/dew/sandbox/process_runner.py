"""ProcessRunner: each program as a limited host process (see :mod:`dew.sandbox.launcher`)."""

from __future__ import annotations

import os
import secrets
import tempfile
import threading

from dew.sandbox.launcher import launch, new_marker, sandbox_environment
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome
from dew.sandbox.program import Program
from dew.sandbox.runner import CancelFlag, job_directory, unreachable_ancestor

__all__ = ["ProcessRunner"]

# Sandbox user ids are drawn from a range no distribution hands out to people or daemons.
DEFAULT_UID_BASE = 1_900_000_000
_UID_SPAN = 1 << 24


class ProcessRunner:
    """Runs programs as host processes through the shared launcher.

    It keeps the host's filesystem and network: a program can read and reach whatever
    its user can. Use :class:`~dew.sandbox.ContainerRunner` for untrusted code.

    Args:
        own_users: run each program under a fresh, otherwise unused uid (and gid), so the
            per-user RLIMIT_NPROC caps forks and every process of the program can be
            found and killed afterwards even if it left its process group. Needs root;
            the default is True exactly when running as root. Without it, programs run
            as the caller and leftovers are found by their environment marker.
        uid_base: first uid of the range (``2**24`` ids) the sandbox users come from.
        temp_root: where job directories are made (default: the system temp directory).
            With own users, every directory above it must be open to other users.
    """

    def __init__(
        self,
        *,
        own_users: bool | None = None,
        uid_base: int = DEFAULT_UID_BASE,
        temp_root: str | None = None,
    ):
        root = os.geteuid() == 0
        if own_users is None:
            own_users = root
        if own_users and not root:
            raise PermissionError(
                f"ProcessRunner.own_users: needs root, running as uid {os.geteuid()}"
            )
        if not 0 < uid_base < 2**31 - _UID_SPAN:
            raise ValueError(
                f"ProcessRunner.uid_base: expected 0 < uid_base < {2**31 - _UID_SPAN}, "
                f"got {uid_base}"
            )
        self.temp_root = temp_root if temp_root is not None else tempfile.gettempdir()
        if own_users:
            closed = unreachable_ancestor(self.temp_root)
            if closed is not None:
                raise ValueError(
                    f"ProcessRunner.temp_root: sandbox users must be able to enter every "
                    f"directory above their job directories, but {closed!r} is closed to "
                    f"other users (temp root {self.temp_root!r}); pass another temp_root"
                )
        self.own_users = own_users
        self._uid_base = uid_base
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    def _take_uid(self) -> int:
        with self._lock:
            while True:
                uid = self._uid_base + secrets.randbelow(_UID_SPAN)
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid

    def _give_uid(self, uid: int) -> None:
        with self._lock:
            self._in_use.discard(uid)

    def run(
        self, program: Program, limits: SandboxLimits, cancel: CancelFlag | None = None
    ) -> Outcome:
        """Run ``program`` in a fresh job directory under ``limits``."""
        uid = self._take_uid() if self.own_users else None
        marker = new_marker()
        try:
            with job_directory(
                program, prefix="dew-sandbox-", owner=uid, root=self.temp_root
            ) as job:
                return launch(
                    program.argv,
                    cwd=job,
                    stdin=program.stdin_bytes,
                    limits=limits,
                    env=sandbox_environment(job, marker),
                    uid=uid,
                    marker=marker,
                    cancel=cancel,
                )
        finally:
            if uid is not None:
                self._give_uid(uid)

    def close(self) -> None:
        """Nothing is held between programs; kept for the Runner interface."""

    def __repr__(self) -> str:
        return f"ProcessRunner(own_users={self.own_users})"

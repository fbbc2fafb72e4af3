"""The interface every runner implements, and the job-directory helper they share."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome
from dew.sandbox.program import Program

__all__ = ["CancelFlag", "Runner", "job_directory", "unreachable_ancestor"]


class CancelFlag(Protocol):
    """Anything with ``is_set()``: a :class:`threading.Event` or a combination of them."""

    def is_set(self) -> bool: ...


@runtime_checkable
class Runner(Protocol):
    """Runs one program to an :class:`Outcome`; safe to call from several threads.

    ``run`` returns an Outcome for anything the program does (including failing to
    start), raises :class:`~dew.sandbox.launcher.SandboxCancelled` after cleaning up when
    ``cancel`` is set, and raises other exceptions only when the runner itself is broken
    (for example an unreachable container engine). ``close`` releases whatever the
    runner still holds; it is idempotent.
    """

    def run(
        self, program: Program, limits: SandboxLimits, cancel: CancelFlag | None = None
    ) -> Outcome: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def job_directory(
    program: Program, *, prefix: str, owner: int | None = None, root: str | None = None
) -> Iterator[str]:
    """A fresh directory holding ``program``'s files, removed (with all contents) on exit.

    ``owner`` (needs root) hands the directory and the files to that uid/gid, so a
    program running as that user can also write scratch files there. Without it the
    directory is mode 0755 and the files 0644, readable by any user (a container's).
    ``root`` is where it is made (default: :func:`tempfile.gettempdir`).
    """
    path = tempfile.mkdtemp(prefix=prefix, dir=root)
    try:
        program.write_into(path)
        os.chmod(path, 0o755)
        if owner is not None:
            for root, dirs, files in os.walk(path):
                os.chown(root, owner, owner)
                for name in dirs + files:
                    os.chown(os.path.join(root, name), owner, owner, follow_symlinks=False)
            os.chmod(path, 0o700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def unreachable_ancestor(directory: str) -> str | None:
    """The first directory on the way to ``directory`` that other users cannot enter.

    A program running under another uid needs search (x) permission for "others" on
    every ancestor of its job directory. None when the whole path is open.
    """
    path = os.path.abspath(directory)
    parts = path.split(os.sep)
    for i in range(1, len(parts) + 1):
        current = os.sep.join(parts[:i]) or os.sep
        if not os.stat(current).st_mode & 0o001:
            return current
    return None

"""The file conventions of crash journals: one writer per directory, files named by rank.

A crash journal is a directory of files a run writes as it goes, so that the next attempt
of the same run can take up where a crash left off. Dew keeps two:
``dew.objectives.rl.EpisodeJournal`` (episode turns, one SQLite database per rank) and
``dew.rollout.WeightJournal`` (the weights batches in flight were drawn from). Both follow
the conventions this module owns:

- **One directory per run.** The writer creates it when it is missing.
- **Per-rank files** are named ``rank-<index>.<suffix>`` with the index written in five
  digits (``rank_file(directory, 3, "sqlite")`` is ``directory/rank-00003.sqlite``;
  ``rank_name`` gives the bare name), so
  the ranks of a multi-process run share the directory without sharing a file.
- **One writer at a time.** A writer holds an exclusive ``flock`` on a lock file in the
  directory while it is open (``lock(directory, name, holder)``: ``rank-<index>.lock`` for
  a per-rank journal, one fixed name for a single-process one). A second writer, in another
  process or in the same one (each ``lock`` opens the file anew), is refused at once with
  ``JournalBusy``, whose message names the directory, the lock file and what is held. The
  lock goes when the writer releases it (``WriterLock.release``, idempotent; the end of a
  ``with`` block; the lock object being garbage-collected) and, since the kernel drops a
  ``flock`` with its last descriptor, when the process dies: a crash never leaves a stale
  lock behind, only the empty lock file, which the next writer reuses. The descriptor is
  not inherited by child processes, so a tool the journal's owner started cannot keep the
  lock alive after the owner dies.
- **JSON sidecars** (small records beside the data, such as which version each batch was
  submitted under) are written with ``write_json``: a temporary file in the directory,
  fsynced and moved onto the name (``dew.files``), so a reader sees the old record or the
  new one, never half of one. ``read_json(path, default)`` gives ``default`` for a file
  that does not exist yet and raises ``ValueError`` naming the file when it holds no JSON
  (something other than a journal wrote it).

``flock`` locks are advisory: they keep out journals, not other programs. They work on
local file systems; on a network file system they depend on its locking.

This module imports nothing of ``dew`` but the leaf ``dew.files``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any

from dew.files import write_json as _write_json


class JournalBusy(RuntimeError):
    """Another writer holds the journal (its lock file is locked)."""


def rank_name(rank: int, suffix: str) -> str:
    """``rank-<index>.<suffix>``, the index in five digits (a negative or bool rank raises)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank: expected an integer >= 0, got {rank!r}")
    return f"rank-{rank:05d}.{suffix}"


def rank_file(directory: str | os.PathLike[str], rank: int, suffix: str) -> str:
    """``directory/rank-<index>.<suffix>`` (see ``rank_name``)."""
    return os.path.join(os.fspath(directory), rank_name(rank, suffix))


class WriterLock:
    """An exclusive ``flock`` on one lock file of a journal directory (module docstring).

    Args:
      directory: the journal directory; created when missing.
      name: the lock file's name in it.
      holder: what the lock guards, for the message of ``JournalBusy``
        ("the journal of rank 0").

    Raises:
      JournalBusy: another writer holds the lock.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str, holder: str) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, name)
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalBusy(
                f"{self.directory}: another writer holds {holder} (lock file {name}); use one "
                "journal directory per run, and close a journal before opening it again"
            ) from None
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether this lock is still held (not released yet)."""
        return self._fd is not None

    def release(self) -> None:
        """Let the next writer in; calling it again does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:  # an unreachable lock could never be released otherwise
        with contextlib.suppress(Exception):
            self.release()

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock(directory: str | os.PathLike[str], name: str, holder: str) -> WriterLock:
    """Take the writer lock ``name`` of ``directory`` (see ``WriterLock``)."""
    return WriterLock(directory, name, holder)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """The JSON value in ``path``, or ``default`` when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)}: not a JSON journal record ({error})") from None


def write_json(path: str | os.PathLike[str], value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON, atomically and fsynced (``dew.files``)."""
    _write_json(path, value)


__all__ = [
    "JournalBusy",
    "WriterLock",
    "lock",
    "rank_file",
    "rank_name",
    "read_json",
    "write_json",
]

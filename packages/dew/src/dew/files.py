"""Atomic file writes: a reader sees the old file or the whole new one, never a half-written one.

``atomic_write(path, mode)`` opens a temporary file in ``path``'s folder; when the ``with``
block ends cleanly the data is flushed and fsynced and ``os.replace`` moves it onto ``path``
(atomic on POSIX within one file system). When the block raises, the temporary file is
removed and ``path`` is left as it was. ``atomic_path(path)`` does the same for writers that
want a file name instead of an open file (a tokenizer's ``save(path)``, for instance).
``write_bytes``, ``write_text`` and ``write_json`` write a whole value that way in one call.

The new file gets the permissions ``open()`` would give it (``0o666`` less the umask), not
the private ``0o600`` of a temporary file.

This module imports only the standard library, so every part of ``dew`` may use it
(``dew.data`` and ``dew.models`` included, which otherwise import nothing else of ``dew``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary file name beside ``path``; on success fsync it and move it onto ``path``.

    The caller writes the file under the yielded name (it exists, empty, when yielded). The
    folder of ``path`` must exist.
    """
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        os.chmod(temp, 0o666 & ~_umask())
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path``.

    Args:
      path: the final file; its folder must exist.
      mode: ``"wb"`` (bytes) or ``"w"`` (text).
      encoding: the text encoding for ``"w"`` (default UTF-8); not allowed with ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: expected 'w' or 'wb', got {mode!r}")
    if mode == "wb" and encoding is not None:
        raise ValueError(f"encoding: only text mode 'w' takes one, got {encoding!r}")
    with atomic_path(path) as temp:
        text = "utf-8" if mode == "w" and encoding is None else encoding
        with open(temp, mode, encoding=text) as handle:
            yield handle
            handle.flush()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    with atomic_write(path, "w", encoding=encoding) as handle:
        handle.write(text)


def write_json(
    path: str | os.PathLike[str],
    value: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    newline: bool = False,
) -> None:
    """Write ``value`` as JSON (UTF-8) to ``path`` atomically, as ``json.dump`` writes it.

    ``newline`` ends the file with a line break. A value ``json`` cannot encode raises before
    anything is moved onto ``path``.
    """
    with atomic_write(path, "w") as handle:
        json.dump(value, handle, indent=indent, sort_keys=sort_keys)
        if newline:
            handle.write("\n")


__all__ = ["atomic_path", "atomic_write", "write_bytes", "write_json", "write_text"]

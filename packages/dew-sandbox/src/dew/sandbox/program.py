"""Programs: files, an argv and stdin, written into a fresh job directory."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence

__all__ = ["Program"]


def _as_bytes(field: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"Program.{field}: expected str or bytes, got {type(value).__name__}")


def _check_relative(name: str) -> None:
    path = pathlib.PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\x00" in name:
        raise ValueError(
            f"Program.files: expected relative paths inside the job directory, got {name!r}"
        )


@dataclasses.dataclass(frozen=True)
class Program:
    """One program to run: files, the command line and what it reads on stdin.

    Attributes:
        files: relative path -> content (``str`` is written as UTF-8). Every path is
            created under a fresh, empty job directory; sub-directories are made as
            needed. Absolute paths and ``..`` are refused.
        argv: the command, run with the job directory as the working directory and
            *without* a shell (no globbing, no redirection). ``argv[0]`` is looked up on
            the sandbox's ``PATH`` (``/usr/local/bin:/usr/bin:/bin``).
        stdin: bytes fed to the program's standard input, then end of file.
    """

    files: Mapping[str, str | bytes]
    argv: Sequence[str]
    stdin: str | bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.files, Mapping):
            raise TypeError(
                f"Program.files: expected a mapping of path to content, "
                f"got {type(self.files).__name__}"
            )
        files = {}
        for name, content in self.files.items():
            if not isinstance(name, str):
                raise TypeError(f"Program.files: expected str paths, got {name!r}")
            _check_relative(name)
            files[name] = _as_bytes(f"files[{name!r}]", content)
        if isinstance(self.argv, (str, bytes)) or not isinstance(self.argv, Sequence):
            raise TypeError(
                f"Program.argv: expected a sequence of strings, got {type(self.argv).__name__}"
            )
        argv = tuple(self.argv)
        if not argv:
            raise ValueError("Program.argv: expected at least the command, got an empty argv")
        for i, arg in enumerate(argv):
            if not isinstance(arg, str) or "\x00" in arg:
                raise ValueError(f"Program.argv[{i}]: expected a str without NUL, got {arg!r}")
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "stdin", _as_bytes("stdin", self.stdin))

    @property
    def stdin_bytes(self) -> bytes:
        """stdin as bytes (always bytes after construction)."""
        assert isinstance(self.stdin, bytes)
        return self.stdin

    def write_into(self, directory: str | os.PathLike[str]) -> None:
        """Write the files under ``directory`` (which should be empty), world-readable."""
        root = pathlib.Path(directory)
        for name, content in self.files.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            assert isinstance(content, bytes)
            target.write_bytes(content)
            target.chmod(0o644)

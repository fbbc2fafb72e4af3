"""Leak scans shared by dew-sandbox tests (a uniquely named module: every package's
tests directory has its own conftest.py)."""

from __future__ import annotations

import os
import tempfile


def sandbox_temp_dirs() -> set[str]:
    """Job directories the runners created under the temp root (and not yet removed)."""
    root = tempfile.gettempdir()
    return {name for name in os.listdir(root) if name.startswith("dew-sandbox-")}


def processes_with(token: str) -> list[tuple[int, str]]:
    """Live, non-zombie processes whose command line contains ``token``."""
    found = []
    needle = token.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in (b"Z", b"X"):
            found.append((int(name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found

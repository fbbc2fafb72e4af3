"""Shared fixtures for dew-sandbox tests: the container engine and leak scans."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from dew.sandbox import ContainerRunner, engine_unavailable_reason

DEFAULT_IMAGE = "dew-sandbox-python:bookworm-stdlib"


def engine_image() -> str:
    """The image container tests use (DEW_SANDBOX_IMAGE, set by tools/ci/container_engine.sh)."""
    return os.environ.get("DEW_SANDBOX_IMAGE", DEFAULT_IMAGE)


@pytest.fixture(scope="session")
def container_image() -> str:
    """The image name, or a skip that says why no engine is usable here."""
    reason = engine_unavailable_reason(engine_image())
    if reason is not None:
        pytest.skip(f"{reason} (run `source tools/ci/container_engine.sh` as root)")
    return engine_image()


@pytest.fixture
def container_runner(container_image: str) -> Iterator[ContainerRunner]:
    runner = ContainerRunner(container_image)
    try:
        yield runner
        assert runner.leftover_containers() == []
    finally:
        runner.close()


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

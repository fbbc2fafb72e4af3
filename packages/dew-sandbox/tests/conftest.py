"""Shared fixtures for dew-sandbox tests: the container engine."""

from __future__ import annotations

import os
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

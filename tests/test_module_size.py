"""The modules split for size stay small: every source file in the directories below is under
400 lines (a module that grows past it is split along a seam, not left to grow)."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT = 400
DIRECTORIES = (
    "packages/dew-rl/src/dew/rl",
    "packages/dew/src/dew/inference",
    "packages/dew/src/dew/objectives/rl",
    "packages/dew/src/dew/sessions",
    "packages/dew/src/dew/rollouts",
    "packages/dew/src/dew/rollouts/episodes",
)


@pytest.mark.parametrize("directory", DIRECTORIES)
def test_source_modules_stay_under_the_limit(directory: str) -> None:
    paths = sorted((ROOT / directory).glob("*.py"))
    assert paths, directory
    sizes = {path.name: len(path.read_text().splitlines()) for path in paths}
    large = {name: n for name, n in sizes.items() if n >= LIMIT}
    assert not large, f"{directory}: {large} at or over {LIMIT} lines; split along a seam"

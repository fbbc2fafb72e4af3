"""examples/tool_episodes.py learns: a short run raises the held-out success rate."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_example_policy_learns_to_use_the_tool():
    spec = importlib.util.spec_from_file_location(
        "tool_episodes", ROOT / "examples" / "tool_episodes.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    before, after = example.main(steps=10, warmup=40, quiet=True)
    assert before <= 0.25  # the warm-up teaches the protocol, not the answer
    assert after >= before + 0.25, (before, after)

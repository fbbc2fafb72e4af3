"""examples/tool_episodes.py learns: a short run raises the held-out success rate."""

from __future__ import annotations

import pathlib

from dew.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_example_policy_learns_to_use_the_tool():
    example = load_script(ROOT / "examples" / "tool_episodes.py")
    before, after = example.main(steps=10, warmup=40, quiet=True)
    assert before <= 0.25  # the warm-up teaches the protocol, not the answer
    assert after >= before + 0.25, (before, after)

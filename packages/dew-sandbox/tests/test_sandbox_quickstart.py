"""``dew quickstart --code``: the entry point this distribution registers, and a tiny run."""

from __future__ import annotations

import json

from dew.data.arithmetic import Problem
from dew.quickstart import main
from dew.quickstart.plugins import load_code_reward
from dew.sandbox.quickstart import code_reward


def test_the_quickstart_finds_this_distributions_code_reward() -> None:
    assert load_code_reward() is code_reward


def test_code_reward_runs_the_program_a_problem_expects() -> None:
    problem = Problem(37, "-", 8)
    with load_code_reward()() as reward:
        assert reward("q", problem.program(), problem.code_tests(), "") == 1.0
        wrong = "```python\nprint(37+8)\n```"
        assert reward("q", wrong, problem.code_tests(), "") == 0.0
        assert reward("q", "no program, just 29", problem.code_tests(), "") == 0.0


def test_tiny_quickstart_with_code_adds_a_sandboxed_stage(tmp_path) -> None:
    run_dir = tmp_path / "run"
    args = ["--size", "tiny", "--code", "--run-dir", str(run_dir), "--progress", "off"]
    assert main(args) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    names = [stage["name"] for stage in summary["stages"]]
    assert names == ["sft", "dpo", "grpo", "code"]
    code = summary["stages"][-1]
    assert code["held_out"] == summary["settings"]["code_held_out"]
    assert 0.0 <= code["accuracy_before"] <= 1.0 and 0.0 <= code["accuracy_after"] <= 1.0
    # The code stage's questions and answers are the program form, scored in the sandbox.
    assert all(e["question"].startswith("python ") for e in code["examples_after"])
    metrics = [json.loads(line) for line in (run_dir / "code" / "metrics.jsonl").open()]
    assert metrics and "reward/mean" in metrics[-1]
    sft_rows = (run_dir / "data" / "sft.jsonl").read_text()
    assert "```python" in sft_rows
    # A second run on the same directory trains nothing.
    before = (run_dir / "summary.json").stat().st_mtime_ns
    assert main(args) == 0
    assert (run_dir / "summary.json").stat().st_mtime_ns == before

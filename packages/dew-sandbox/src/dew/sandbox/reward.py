"""CodeReward: score a completion by running its last Python block on test cases."""

from __future__ import annotations

import json
import re

from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.outcome import Outcome, Verdict
from dew.sandbox.program import Program

__all__ = ["CodeReward", "extract_python_block", "parse_cases", "stdout_matches"]

# An opening fence at the start of a line with a python info string, the body, and a
# closing fence at the start of a line. Non-greedy, so each match is one block.
_BLOCK = re.compile(
    r"^[ \t]*```[ \t]*(?:python3?|py)\b[^\n]*\n(?P<body>.*?)^[ \t]*```[ \t]*$",
    re.IGNORECASE | re.MULTILINE | re.DOTALL,
)


def extract_python_block(completion: str) -> str | None:
    """The body of the last closed ```python (or ```py / ```python3) block, else None.

    A block that is opened but never closed (a completion cut at its token limit) does
    not count.
    """
    bodies = [m.group("body") for m in _BLOCK.finditer(completion)]
    return bodies[-1] if bodies else None


def parse_cases(ground_truth: str) -> list[tuple[str, str]]:
    """Read the ground truth: a JSON list of ``{"stdin": str, "stdout": str}`` objects."""
    try:
        cases = json.loads(ground_truth)
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"CodeReward ground_truth: expected a JSON list of {{stdin, stdout}} cases, "
            f"got text that is not JSON ({error})"
        ) from None
    if not isinstance(cases, list) or not cases:
        raise ValueError(
            f"CodeReward ground_truth: expected a non-empty JSON list of cases, got {cases!r:.80}"
        )
    parsed = []
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or not {"stdin", "stdout"} <= case.keys():
            raise ValueError(
                f"CodeReward ground_truth[{i}]: expected an object with 'stdin' and 'stdout', "
                f"got {case!r:.80}"
            )
        if not isinstance(case["stdin"], str) or not isinstance(case["stdout"], str):
            raise ValueError(
                f"CodeReward ground_truth[{i}]: expected string 'stdin' and 'stdout', got "
                f"{type(case['stdin']).__name__} and {type(case['stdout']).__name__}"
            )
        parsed.append((case["stdin"], case["stdout"]))
    return parsed


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def stdout_matches(actual: str, expected: str) -> bool:
    """Line-by-line equality, ignoring trailing spaces on each line and trailing blank lines."""
    return _lines(actual) == _lines(expected)


class CodeReward:
    """A reward with the ``reward(data_source, completion, ground_truth, extra_info)`` shape.

    The last fenced Python block of the completion is written to ``main.py`` and run
    once per test case through ``fleet`` (cases run concurrently on the fleet's
    workers), with the case's ``stdin``. A case passes when the program COMPLETED and
    its stdout matches the case's ``stdout`` line by line (see :func:`stdout_matches`).

    The score is the fraction of passing cases, or with ``all_or_nothing`` 1.0 when all
    pass and 0.0 otherwise. A completion without a closed Python block scores 0.0 and
    runs nothing. A malformed ``ground_truth`` raises ValueError (a data error, not a
    policy failure).

    Args:
        fleet: where the programs run (its runner and limits apply).
        all_or_nothing: score 1/0 instead of the fraction.
        python: the interpreter's name or path inside the sandbox.
    """

    #: The prompt fields it cannot score without (front ends refuse prompts that lack them).
    needs = ("ground_truth",)

    def __init__(
        self, fleet: SandboxFleet, all_or_nothing: bool = False, *, python: str = "python3"
    ) -> None:
        self.fleet = fleet
        self.all_or_nothing = all_or_nothing
        self.python = python
        self.last_outcomes: list[Outcome] = []

    def __call__(
        self, data_source: str, completion: str, ground_truth: str, extra_info: str
    ) -> float:
        """Score one completion; ``data_source`` and ``extra_info`` are not used."""
        cases = parse_cases(ground_truth)
        code = extract_python_block(completion)
        if code is None:
            self.last_outcomes = []
            return 0.0
        programs = [
            Program({"main.py": code}, [self.python, "main.py"], stdin=stdin) for stdin, _ in cases
        ]
        outcomes = self.fleet.run(programs)
        self.last_outcomes = outcomes
        passed = sum(
            outcome.verdict is Verdict.COMPLETED and stdout_matches(outcome.text(), expected)
            for outcome, (_, expected) in zip(outcomes, cases, strict=True)
        )
        if self.all_or_nothing:
            return 1.0 if passed == len(cases) else 0.0
        return passed / len(cases)

    reward = __call__

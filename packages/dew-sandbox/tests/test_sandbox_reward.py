"""CodeReward on realistic completions, through real sandboxed processes (and containers)."""

from __future__ import annotations

import json

import pytest

from dew.sandbox import (
    CodeReward,
    ContainerRunner,
    Outcome,
    ProcessRunner,
    Program,
    SandboxFleet,
    SandboxLimits,
)
from dew.sandbox.reward import extract_python_block, parse_cases, stdout_matches

LIMITS = SandboxLimits(cpu_seconds=1, deadline_seconds=3)

CASES = json.dumps(
    [
        {"stdin": "3\n1 2 3\n", "stdout": "6\n"},
        {"stdin": "1\n-5\n", "stdout": "-5\n"},
        {"stdin": "4\n10 20 30 40\n", "stdout": "100"},
        {"stdin": "0\n\n", "stdout": "0\n"},
    ]
)

CORRECT = """To solve this, read n and then the n numbers, and print their sum.

Here is a first attempt that I will improve:

```python
print(sum(map(int, input().split())))
```

That reads the wrong line. The fixed version reads both lines:

```python
import sys

def main() -> None:
    data = sys.stdin.read().split()
    n = int(data[0])
    numbers = list(map(int, data[1:1 + n]))
    print(sum(numbers))

if __name__ == "__main__":
    main()
```

This runs in O(n)."""

# Wrong on the empty case only: the assert fails there and the program exits 1.
PARTIAL = """```python
n = int(input())
xs = [int(x) for x in input().split()]
assert xs, "no numbers"
print(sum(xs))
```"""

NO_CODE = "The answer is to add the numbers together; in Python you would call sum()."

UNCLOSED = "```python\nprint(sum(map(int, open(0).read().split()[1:])))\n"

TRAILING_SPACES = "```py\nimport sys\nd = sys.stdin.read().split()\nprint(str(sum(map(int, d[1:]))) + '   ')\nprint()\n```"

INFINITE = "```python\nwhile True:\n    pass\n```"


class CountingRunner(ProcessRunner):
    """A real ProcessRunner that counts the programs it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.programs = 0

    def run(self, program: Program, limits: SandboxLimits, cancel=None) -> Outcome:
        self.programs += 1
        return super().run(program, limits, cancel)


@pytest.fixture(scope="module")
def counting() -> CountingRunner:
    return CountingRunner()


@pytest.fixture(scope="module")
def fleet(counting: CountingRunner):
    with SandboxFleet(counting, limits=LIMITS, workers=2) as fleet:
        yield fleet


def test_fraction_of_passing_cases(fleet: SandboxFleet) -> None:
    reward = CodeReward(fleet)
    assert reward("code", CORRECT, CASES, "") == 1.0
    assert reward("code", PARTIAL, CASES, "{}") == 0.75
    assert reward("code", TRAILING_SPACES, CASES, "") == 1.0
    assert reward("code", INFINITE, CASES, "") == 0.0


def test_all_or_nothing(fleet: SandboxFleet) -> None:
    reward = CodeReward(fleet, all_or_nothing=True)
    assert reward("code", CORRECT, CASES, "") == 1.0
    assert reward("code", PARTIAL, CASES, "") == 0.0


def test_no_code_block_scores_zero_and_runs_nothing(
    fleet: SandboxFleet, counting: CountingRunner
) -> None:
    reward = CodeReward(fleet)
    before = counting.programs
    assert reward("code", NO_CODE, CASES, "") == 0.0
    assert reward("code", UNCLOSED, CASES, "") == 0.0
    assert counting.programs == before
    assert reward("code", CORRECT, CASES, "") == 1.0
    assert counting.programs == before + 4  # one program per case


def test_last_block_wins_and_extraction_edge_cases() -> None:
    assert extract_python_block(CORRECT).startswith("import sys")
    assert extract_python_block(NO_CODE) is None
    assert extract_python_block(UNCLOSED) is None
    assert extract_python_block("```js\nconsole.log(1)\n```") is None
    assert extract_python_block("```Python3\nprint(1)\n```\n```bash\nls\n```") == "print(1)\n"


def test_line_matching_rules() -> None:
    assert stdout_matches("1\n2\n", "1\n2")
    assert stdout_matches("1  \n2\n\n\n", "1\n2\n")
    assert not stdout_matches("1\n 2\n", "1\n2\n")  # leading space matters
    assert not stdout_matches("1\n2\n3\n", "1\n2\n")


@pytest.mark.parametrize(
    ("ground_truth", "match"),
    [
        ("not json", "not JSON"),
        ("[]", "non-empty JSON list"),
        ('{"stdin": "", "stdout": ""}', "non-empty JSON list"),
        ('[{"stdin": ""}]', r"ground_truth\[0\]: expected an object with 'stdin' and 'stdout'"),
        ('[{"stdin": "", "stdout": 3}]', r"ground_truth\[0\]: expected string"),
    ],
)
def test_malformed_ground_truth_names_the_field(ground_truth: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_cases(ground_truth)


def test_reward_in_containers(container_image: str) -> None:
    with SandboxFleet(ContainerRunner(container_image), limits=LIMITS, workers=2) as fleet:
        reward = CodeReward(fleet)
        assert reward("code", CORRECT, CASES, "") == 1.0
        assert reward("code", PARTIAL, CASES, "") == 0.75

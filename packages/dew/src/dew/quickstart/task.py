"""The quickstart's task: two-operand integer arithmetic generated in code.

A problem is ``a + b`` or ``a - b`` with ``0 <= a, b < limit``; subtraction keeps ``a >= b``
so every answer is a non-negative integer. All problems of the space are enumerated once,
shuffled by ``seed`` and cut into a held-out set (the first ``held_out`` problems) and a
training pool (the rest), so the two never share a problem and a different seed gives a
different split.

Texts:

* the question, for example ``"37+48"`` (the user message);
* a worked answer (the SFT target): the sum written out, then the result in ``\\boxed{}``,
  for example ``"37+48=85 \\boxed{85}"``;
* a wrong answer for DPO's rejected side: the same shape with a result moved by a typical
  slip (a dropped or doubled carry, an off-by-one digit), never equal to the right result.
"""

from __future__ import annotations

import dataclasses

import numpy as np

OPERATORS = ("+", "-")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One arithmetic question with its exact integer answer."""

    a: int
    op: str
    b: int

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"Problem.op: expected one of {OPERATORS}, got {self.op!r}")
        if self.a < 0 or self.b < 0:
            raise ValueError(f"Problem: operands must be >= 0, got a={self.a}, b={self.b}")
        if self.op == "-" and self.a < self.b:
            raise ValueError(f"Problem: subtraction needs a >= b, got {self.a} - {self.b}")

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def question(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    def worked(self, result: int | None = None) -> str:
        """The worked answer text; ``result`` replaces the true result (for wrong answers)."""
        value = self.answer if result is None else result
        return f"{self.question}={value} \\boxed{{{value}}}"

    def wrong_result(self, rng: np.random.Generator) -> int:
        """A plausible wrong result: off by 1 or 10 (a slipped digit or carry), never < 0."""
        right = self.answer
        choices = [d for d in (-10, -1, 1, 10) if right + d >= 0]
        return right + int(rng.choice(choices))


@dataclasses.dataclass(frozen=True)
class Split:
    """Disjoint training and held-out problems."""

    train: tuple[Problem, ...]
    held_out: tuple[Problem, ...]


def all_problems(limit: int) -> list[Problem]:
    """Every problem with operands below ``limit``, in a fixed order."""
    if not isinstance(limit, int) or limit < 2:
        raise ValueError(f"limit: expected an int >= 2, got {limit!r}")
    problems = []
    for a in range(limit):
        for b in range(limit):
            problems.append(Problem(a, "+", b))
            if a >= b:
                problems.append(Problem(a, "-", b))
    return problems


def split(limit: int, held_out: int, seed: int) -> Split:
    """Shuffle every problem by ``seed``; the first ``held_out`` are held out, the rest train."""
    problems = all_problems(limit)
    if not isinstance(held_out, int) or not 0 < held_out < len(problems):
        raise ValueError(
            f"held_out: expected an int in (0, {len(problems)}) for limit={limit}, got {held_out!r}"
        )
    order = np.random.default_rng(seed).permutation(len(problems))
    shuffled = [problems[i] for i in order]
    return Split(train=tuple(shuffled[held_out:]), held_out=tuple(shuffled[:held_out]))

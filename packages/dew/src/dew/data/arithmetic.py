"""Two-operand integer arithmetic generated in code: the task of ``dew quickstart``.

A problem is ``a + b`` or ``a - b`` with ``0 <= a, b < limit``; subtraction keeps ``a >= b``
so every answer is a non-negative integer. All problems of the space are enumerated once,
shuffled by ``seed`` and cut into a held-out set (the first ``held_out`` problems) and a
training pool (the rest), so the two never share a problem and a different seed gives a
different split.

Texts:

* the question, for example ``"37+48"`` (the user message);
* a worked answer (the SFT target): column additions or subtractions from the ones digit up,
  then the result in ``\\boxed{}``, for example ``"7+8=15 3+4+1=8 \\boxed{85}"``. Writing
  the columns out lets a small model learn the algorithm instead of memorising results, so
  held-out problems are solved by the same single-digit steps as the training ones;
* a wrong worked answer (DPO's fallback rejected side): the same steps with one typical slip
  (a forgotten carry or borrow, a column off by one) and the wrong result it leads to;
* with ``--code``, the same problem asked as ``"python 37+48"`` and answered by a fenced Python
  program that prints the result; its ground truth is one ``{"stdin", "stdout"}`` test case
  that ``dew.sandbox.CodeReward`` runs.
"""

from __future__ import annotations

import dataclasses
import json

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

    def columns(self, slip: int | None = None) -> tuple[list[str], int]:
        """Column-by-column steps, least significant first, and the result they give.

        Addition writes ``x+y=s`` per column (``x+y+1=s`` with a carry; ``s`` may be two
        digits, its tens digit carries). Subtraction writes ``x-y=d``, borrowing as ``1x-y=d``
        and paying the borrow in the next column as ``x-y-1=d``. ``slip`` (a column index)
        injects the most common mistake there: the carry or borrow coming into that column
        is forgotten, or, when there is none, the column's digit is off by one.
        """
        width = max(len(str(self.a)), len(str(self.b)))
        xs = [int(c) for c in str(self.a).rjust(width, "0")][::-1]
        ys = [int(c) for c in str(self.b).rjust(width, "0")][::-1]
        steps, digits, carry = [], [], 0
        for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
            incoming = carry
            if k == slip and incoming:
                incoming = 0
            if self.op == "+":
                total = x + y + incoming
                if k == slip and not carry:
                    total = total + 1 if total % 10 != 9 else total - 1
                steps.append(f"{x}+{y}+1={total}" if incoming else f"{x}+{y}={total}")
                digits.append(total % 10)
                carry = total // 10
            else:
                top = x - incoming
                borrow = int(top < y)
                value = top + 10 * borrow - y
                if k == slip and not carry:
                    value = value + 1 if value < 9 else value - 1
                shown = f"1{x}" if borrow else f"{x}"
                steps.append(f"{shown}-{y}-1={value}" if incoming else f"{shown}-{y}={value}")
                digits.append(value)
                carry = borrow
        if carry and self.op == "+":
            digits.append(carry)
        result = int("".join(str(d) for d in reversed(digits)))
        return steps, result

    def careless(self) -> str | None:
        """The worked answer a careless tutor writes, or ``None`` when the problem gives
        the tutor nothing to get wrong.

        An addition whose result has a hundreds digit is worked right but boxed without it
        (``95+48``: ``5+8=13 9+4+1=14 \\boxed{43}``); a
        subtraction that borrows from the tens column forgets the borrow there
        (``worked(1)``). Every other problem is worked right.
        """
        if self.op == "+":
            if self.answer < 100:
                return None
            steps, result = self.columns()
            return " ".join(steps) + f" \\boxed{{{result - 100}}}"
        if self.a < 10 or self.a % 10 >= self.b % 10:
            return None
        return self.worked(1)

    def worked(self, slip: int | None = None) -> str:
        """The worked answer: the column steps, then the result in ``\\boxed{}``.

        With ``slip`` the steps make that mistake and box the wrong result they lead to.
        """
        steps, result = self.columns(slip)
        return " ".join(steps) + f" \\boxed{{{result}}}"

    @property
    def code_question(self) -> str:
        """The question asking for a program, e.g. ``"python 37+48"``."""
        return f"python {self.question}"

    def program(self) -> str:
        """A fenced Python answer that prints the result."""
        return f"```python\nprint({self.a}{self.op}{self.b})\n```"

    def code_tests(self) -> str:
        """``CodeReward``'s ground truth: one case, no stdin, the answer on stdout."""
        return json.dumps([{"stdin": "", "stdout": str(self.answer)}])

    def wrong(self, rng: np.random.Generator) -> str:
        """A worked answer with one plausible slip whose boxed result is wrong."""
        width = max(len(str(self.a)), len(str(self.b)))
        for column in rng.permutation(width):
            text = self.worked(int(column))
            if self.columns(int(column))[1] != self.answer:
                return text
        raise AssertionError(f"no wrong answer found for {self.question}")  # pragma: no cover


def careless(problems: tuple[Problem, ...], rate: float, seed: int) -> list[bool]:
    """Which demonstrations the careless tutor writes (``Problem.careless``): each problem
    that has a careless answer, with probability ``rate`` (a draw seeded by ``seed``)."""
    draws = np.random.default_rng([seed, 3]).random(len(problems))
    return [
        p.careless() is not None and bool(u < rate) for p, u in zip(problems, draws, strict=True)
    ]


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


__all__ = ["OPERATORS", "Problem", "Split", "all_problems", "careless", "split"]

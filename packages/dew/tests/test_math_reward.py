"""MathReward and its answer parser on tricky completions."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dew.rewards import MathReward
from dew.rewards.math_answer import last_boxed, to_fraction

REWARD = MathReward()


def score(completion: str, ground_truth: str) -> float:
    return REWARD("gsm8k", completion, ground_truth, "{}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{3}", "3"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{12}}", "{12}"),
        ("\\boxed {7}", "7"),
        ("\\fbox{9}", "9"),
        ("no box at all", None),
        ("\\boxed{12", None),
        ("\\boxed{1} and an unclosed \\boxed{2", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("0.5", Fraction(1, 2)),
        ("1/2", Fraction(1, 2)),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("\\dfrac{1}{2}", Fraction(1, 2)),
        ("\\tfrac12", Fraction(1, 2)),
        ("2/4", Fraction(1, 2)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac{-1}{2}", Fraction(-1, 2)),
        ("−3", Fraction(-3)),
        ("+3", Fraction(3)),
        ("- 3", Fraction(-3)),
        (" 1 / 2 ", Fraction(1, 2)),
        ("\\frac{\\frac{1}{2}}{3}", Fraction(1, 6)),
        ("{1}/{3}", Fraction(1, 3)),
        ("2.50", Fraction(5, 2)),
        (".25", Fraction(1, 4)),
        ("1,000", Fraction(1000)),
        ("1{,}234{,}567.5", Fraction(2469135, 2)),
        ("$42$", Fraction(42)),
        ("42.", Fraction(42)),
        ("\\left(3\\right)", Fraction(3)),
        ("\\text{12}", Fraction(12)),
        ("2 \\cdot 3 + 1", Fraction(7)),
        ("123456789012345678901234567890", Fraction(123456789012345678901234567890)),
        ("1,00", None),
        ("1,2", None),
        ("1 2", None),
        ("1/0", None),
        ("\\frac{1}{0}", None),
        ("\\sqrt{2}", None),
        ("x+1", None),
        ("50\\%", None),
        ("1e3", None),
        ("(1", None),
        ("", None),
        ("\\frac{1}", None),
    ],
)
def test_to_fraction(answer: str, value: Fraction | None) -> None:
    assert to_fraction(answer) == value


@pytest.mark.parametrize(
    ("completion", "ground_truth", "expected"),
    [
        ("The answer is \\boxed{0.5}.", "1/2", 1.0),
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("$\\boxed{\\dfrac{3}{6}}$", "\\frac{1}{2}", 1.0),
        ("\\boxed{-0.5}", "-\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "-1/2", 0.0),
        ("\\boxed{0.333}", "1/3", 0.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{1,00}", "100", 0.0),
        ("first \\boxed{1}, finally \\boxed{2}", "2", 1.0),
        ("first \\boxed{1}, finally \\boxed{2}", "1", 0.0),
        ("no box: the answer is 72", "72", 0.0),
        ("\\boxed{}", "", 0.0),
        ("\\boxed{72", "72", 0.0),
        ("\\boxed{\\frac{\\frac{1}{2}}{3}}", "1/6", 1.0),
        ("\\boxed{ 7 }", "7", 1.0),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{ 2 }", 1.0),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{3}", 0.0),
        ("\\boxed{1/0}", "1/0", 1.0),
        ("\\boxed{12}", "#### \\boxed{12}", 1.0),
        ("\\boxed{5}", "five", 0.0),
    ],
)
def test_math_reward(completion: str, ground_truth: str, expected: float) -> None:
    assert score(completion, ground_truth) == expected


def test_custom_scores() -> None:
    reward = MathReward(correct=2.0, incorrect=-1.0)
    assert reward("m", "\\boxed{4}", "4", "") == 2.0
    assert reward("m", "\\boxed{5}", "4", "") == -1.0


@pytest.mark.parametrize("field", ["data_source", "completion", "ground_truth", "extra_info"])
def test_non_string_fields_are_refused(field: str) -> None:
    arguments = {
        "data_source": "m",
        "completion": "\\boxed{1}",
        "ground_truth": "1",
        "extra_info": "",
    }
    arguments[field] = 1  # type: ignore[assignment]
    with pytest.raises(TypeError, match=field):
        REWARD(**arguments)

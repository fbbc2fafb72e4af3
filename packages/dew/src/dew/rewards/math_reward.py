"""MathReward: 1.0 when the last boxed answer of a completion equals the reference exactly."""

from __future__ import annotations

from dew.rewards.math_answer import last_boxed, normalize, to_fraction


def _field(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"MathReward: {name} must be a str, got {type(value).__name__}")
    return value


class MathReward:
    """Exact-answer reward for math completions, with the reward signature of the rollouts.

    ``reward(data_source, completion, ground_truth, extra_info) -> float`` reads the last
    ``\\boxed{...}`` of ``completion`` and scores ``correct`` when it equals ``ground_truth``,
    ``incorrect`` otherwise (also when there is no box, an unclosed box or an empty one).

    Equality is exact rational equality after the normalisation described in
    :mod:`dew.rewards.math_answer`: ``0.5``, ``1/2``, ``\\frac{1}{2}``, ``\\dfrac12`` and
    ``2/4`` all agree, ``0.333`` and ``1/3`` do not. When either side is not a rational
    expression (``\\sqrt{2}``, ``x+1``, ``50\\%``), the two normalised strings must be equal
    once all whitespace is removed. A ``ground_truth`` that itself holds a ``\\boxed{}`` is
    compared by its last box. ``data_source`` and ``extra_info`` are accepted and unused.

    ``needs`` names the prompt fields it cannot score without: front ends refuse prompts
    whose rows lack one before any step (an empty ``ground_truth`` would score every
    completion as wrong, silently).
    """

    needs = ("ground_truth",)

    def __init__(self, correct: float = 1.0, incorrect: float = 0.0) -> None:
        self.correct = float(correct)
        self.incorrect = float(incorrect)

    def matches(self, completion: str, ground_truth: str) -> bool:
        """Whether the completion's last boxed answer equals ``ground_truth``."""
        answer = last_boxed(_field("completion", completion))
        if answer is None:
            return False
        reference = _field("ground_truth", ground_truth)
        boxed_reference = last_boxed(reference)
        if boxed_reference is not None:
            reference = boxed_reference
        if not normalize(answer).strip():
            return False
        mine, theirs = to_fraction(answer), to_fraction(reference)
        if mine is not None and theirs is not None:
            return mine == theirs
        squeeze = "".join
        return squeeze(normalize(answer).split()) == squeeze(normalize(reference).split())

    def __call__(
        self, data_source: str, completion: str, ground_truth: str, extra_info: str
    ) -> float:
        """``correct`` or ``incorrect`` for one completion (see the class docstring)."""
        _field("data_source", data_source)
        _field("extra_info", extra_info)
        return self.correct if self.matches(completion, ground_truth) else self.incorrect

"""Held-out accuracy of a policy by greedy decoding, scored by ``MathReward`` (or a score of
the caller's); ``dew quickstart`` measures every stage with it.

Each held-out question is rendered with the chat template and its generation prompt,
decoded greedily (temperature 0) by ``dew.inference.TextGeneration`` until ``<|end|>`` or the
token budget, and the decoded text is scored by ``MathReward`` against the exact integer
answer: a problem counts as solved only when the last ``\\boxed{}`` of the response equals it.
One ``Evaluator`` keeps its compiled program, so evaluating before and after every stage
compiles once. The quickstart's ``--code`` stage's evaluator asks ``Problem.code_question``
instead and scores with the sandbox's code reward (``question`` and ``score`` arguments).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from dew.data.arithmetic import Problem
from dew.data.chat.template import ChatTokenizer, prompt_ids
from dew.inference import TextGeneration
from dew.rewards.math_reward import MathReward
from dew.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """Share of held-out problems solved, with every question, response and verdict.

    ``standard_error`` is the binomial ``sqrt(p (1 - p) / n)`` of the estimate.
    """

    accuracy: float
    solved: int
    total: int
    questions: tuple[str, ...]
    responses: tuple[str, ...]
    correct: tuple[bool, ...]

    @property
    def standard_error(self) -> float:
        return standard_error(self.accuracy, self.total)


def standard_error(accuracy: float, total: int) -> float:
    """Binomial standard error ``sqrt(p (1 - p) / n)`` of an accuracy over ``total`` items."""
    return math.sqrt(max(accuracy * (1.0 - accuracy), 0.0) / total)


def changed(
    before: Accuracy, after: Accuracy, fixed: int = 3, broken: int = 2
) -> list[dict[str, Any]]:
    """Up to ``fixed`` problems ``after`` solves that ``before`` did not, then up to ``broken``
    the other way round: question, both responses and both verdicts, in held-out order."""
    if before.questions != after.questions:
        raise ValueError("after: expected the same held-out questions as before")
    out: list[dict[str, Any]] = []
    for want, limit in ((True, fixed), (False, broken)):
        found = 0
        for k, question in enumerate(after.questions):
            if found >= limit:
                break
            if after.correct[k] == want and before.correct[k] != want:
                out.append(
                    {
                        "question": question,
                        "before": before.responses[k],
                        "after": after.responses[k],
                        "correct_before": before.correct[k],
                        "correct_after": after.correct[k],
                    }
                )
                found += 1
    return out


class Evaluator:
    """Greedy held-out accuracy of a decoder's variables.

    Args:
      model: a ``dew.models`` decoder.
      tokenizer: the ``ChatTokenizer`` of the policy (e.g. ``dew.data.chat.build_tokenizer``'s).
      problems: the held-out problems.
      eos_id: the id that ends a response (``<|end|>``).
      max_new_tokens: the response budget.
      question: the user message of a problem (default ``Problem.question``).
      score: ``score(problem, response_text) -> bool`` (default: ``MathReward`` on the exact
        answer).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: ChatTokenizer,
        problems: Sequence[Problem],
        eos_id: int,
        max_new_tokens: int,
        question: Callable[[Problem], str] | None = None,
        score: Callable[[Problem, str], bool] | None = None,
    ) -> None:
        if not problems:
            raise ValueError("problems: expected at least one held-out problem, got none")
        self.tokenizer = tokenizer
        self.problems = tuple(problems)
        self.question = question or (lambda p: p.question)
        self.contexts = [prompt_ids(tokenizer, self.question(p)) for p in self.problems]
        self.generation = TextGeneration(model)
        self.sampling = Sampling(temperature=0.0, eos_id=eos_id)
        self.eos_id = eos_id
        self.max_new_tokens = max_new_tokens
        reward = MathReward()
        self.score = score or (
            lambda problem, text: reward("quickstart", text, str(problem.answer), "") > 0
        )

    def __call__(self, variables: Mapping[str, Any]) -> Accuracy:
        self.generation.bind(variables)
        out = self.generation(self.contexts, self.max_new_tokens, jax.random.key(0), self.sampling)
        assert isinstance(out, list)
        responses: list[str] = []
        correct: list[bool] = []
        for problem, generation in zip(self.problems, out, strict=True):
            ids = [int(i) for i in generation.ids if int(i) != self.eos_id]
            text = self.tokenizer.decode(ids)
            responses.append(text)
            correct.append(bool(self.score(problem, text)))
        total = len(self.problems)
        solved = sum(correct)
        questions = tuple(self.question(p) for p in self.problems)
        return Accuracy(solved / total, solved, total, questions, tuple(responses), tuple(correct))


__all__ = ["Accuracy", "Evaluator", "changed", "standard_error"]

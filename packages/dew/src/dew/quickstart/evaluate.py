"""Held-out accuracy by greedy decoding, scored by ``MathReward``.

Each held-out question is rendered with the chat template and its generation prompt,
decoded greedily (temperature 0) by ``dew.inference.TextGeneration`` until ``<|end|>`` or the
token budget, and the decoded text is scored by ``MathReward`` against the exact integer
answer: a problem counts as solved only when the last ``\\boxed{}`` of the response equals it.
One ``Evaluator`` keeps its compiled program, so evaluating before and after every stage
compiles once. The ``--code`` stage's evaluator asks ``Problem.code_question`` instead and
scores with the sandbox's code reward (``question`` and ``score`` arguments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from dew.data.chat.template import ChatTokenizer
from dew.inference import TextGeneration
from dew.quickstart.task import Problem
from dew.rewards import MathReward
from dew.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """Share of held-out problems solved, with a few decoded examples for the report."""

    accuracy: float
    solved: int
    total: int
    examples: tuple[tuple[str, str, bool], ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "solved": self.solved,
            "total": self.total,
            "examples": [
                {"question": q, "response": r, "correct": ok} for q, r, ok in self.examples
            ],
        }


def prompt_ids(tokenizer: ChatTokenizer, question: str) -> list[int]:
    """The ids of one user question followed by the assistant generation prompt."""
    messages = [{"role": "user", "content": question}]
    return tokenizer.encode(tokenizer.render(messages, add_generation_prompt=True))


class Evaluator:
    """Greedy held-out accuracy of a decoder's variables.

    Args:
      model: a ``dew.models`` decoder.
      tokenizer: the quickstart's ``ChatTokenizer``.
      problems: the held-out problems.
      eos_id: the id that ends a response (``<|end|>``).
      max_new_tokens: the response budget.
      keep_examples: how many decoded responses to keep for the report.
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
        keep_examples: int = 4,
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
        self.keep_examples = keep_examples
        reward = MathReward()
        self.score = score or (
            lambda problem, text: reward("quickstart", text, str(problem.answer), "") > 0
        )

    def __call__(self, variables: Mapping[str, Any]) -> Accuracy:
        self.generation.bind(variables)
        out = self.generation(self.contexts, self.max_new_tokens, jax.random.key(0), self.sampling)
        assert isinstance(out, list)
        solved = 0
        examples: list[tuple[str, str, bool]] = []
        for problem, generation in zip(self.problems, out, strict=True):
            ids = [int(i) for i in generation.ids if int(i) != self.eos_id]
            text = self.tokenizer.decode(ids)
            ok = bool(self.score(problem, text))
            solved += int(ok)
            if len(examples) < self.keep_examples:
                examples.append((self.question(problem), text, ok))
        total = len(self.problems)
        return Accuracy(solved / total, solved, total, tuple(examples))

"""On-policy DPO pairs: where the starting policy's own answer goes wrong, and the right id.

The policy that DPO starts from (the SFT model) answers a sample of training questions, once
greedily and ``dpo_samples`` times at ``dpo_temperature``. Every wrong answer becomes the
rejected side of a pair; the chosen side is the correct sample that agrees with it longest
(or, when none of the samples is right, the reference worked answer).

What DPO scores: the whole chosen answer, and on the rejected side only the id where it
parts from the chosen one (the first wrong step). What follows a slip is a consistent
continuation of a wrong intermediate result, and pushing it down would teach the model to
stop writing well-formed steps; the parting id is the mistake itself. Scoring the whole
chosen answer keeps the preference anchored: raising the likelihood of every right step
holds the rest of the policy in place while the wrong id is pushed below the right one (the
shared prefix is scored on one side only, so it counts as part of the right answer).

``PreferenceCheck`` gives the share of pairs whose right id the variables already rank above
the wrong one (DPO's reward accuracy judged by the policy itself, before and after training).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.data.preference_text import common_prefix
from dew.inference import TextGeneration
from dew.rewards import MathReward
from dew.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class Pair:
    """One preference: a shared context and the right and wrong id that follow it.

    prompt: the question's ids with the generation prompt. prefix: the response ids both
    answers share. chosen_id, rejected_id: the next id of the right and of the wrong answer.
    chosen_rest: the right answer's ids after ``chosen_id`` (to its end id).
    question, chosen_text, rejected_text: the question and the two whole answers (reports).
    """

    prompt: tuple[int, ...]
    prefix: tuple[int, ...]
    chosen_id: int
    rejected_id: int
    chosen_rest: tuple[int, ...]
    question: str
    chosen_text: str
    rejected_text: str

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt + self.prefix

    def record(self) -> str:
        """The ``PreferencePairs`` JSON record: the whole chosen answer is scored, and the
        rejected side's parting id."""
        prompt, prefix = list(self.prompt), list(self.prefix)
        chosen = prefix + [self.chosen_id] + list(self.chosen_rest)
        return json.dumps(
            {
                "chosen": prompt + chosen,
                "rejected": prompt + prefix + [self.rejected_id],
                "chosen_mask": [0] * len(prompt) + [1] * len(chosen),
                "rejected_mask": [0] * (len(prompt) + len(prefix)) + [1],
            }
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "chosen": self.chosen_text,
            "rejected": self.rejected_text,
            "parting_index": len(self.prefix),
        }


def parting_index(chosen: Sequence[int], rejected: Sequence[int]) -> int | None:
    """Index of the first id where ``rejected`` departs from ``chosen``; None when it never
    does (equal answers, or one a prefix of the other: nothing to prefer at one id)."""
    for index, (a, b) in enumerate(zip(chosen, rejected)):
        if a != b:
            return index
    return None


def slip_pair(
    prompt: Sequence[int],
    right: Sequence[int],
    wrong: Sequence[int],
    question: str,
    right_text: str,
    wrong_text: str,
) -> Pair:
    """The pair of a right and a wrong answer's ids that part somewhere (a ``ValueError``
    names the question when they never do)."""
    at = parting_index(right, wrong)
    if at is None:
        raise ValueError(f"slip_pair ({question}): the two answers never part: {wrong_text!r}")
    return Pair(
        prompt=tuple(prompt),
        prefix=tuple(right[:at]),
        chosen_id=right[at],
        rejected_id=wrong[at],
        chosen_rest=tuple(right[at + 1 :]),
        question=question,
        chosen_text=right_text,
        rejected_text=wrong_text,
    )


def build_pairs(
    generation: TextGeneration,
    decode: Any,
    items: Sequence[tuple[str, list[int], list[int], str]],
    end_id: int,
    max_new_tokens: int,
    samples: int,
    temperature: float,
    key: jax.Array,
) -> list[Pair]:
    """Pairs from the bound policy's own answers to ``items``.

    items: ``(question, prompt ids, reference answer ids ending in end_id, exact answer)``.
    Each question is answered greedily and ``samples`` times at ``temperature``; answers are
    judged by ``MathReward`` on ``decode(ids without end_id)``. Wrong answers pair with the
    closest correct one (see the module docstring); duplicates within a question are dropped.
    Pairs come in item order, greedy mistakes first within an item. Deterministic in ``key``.
    """
    prompts = [prompt for _, prompt, _, _ in items]
    drawn: list[list[Any]] = [
        list(generation(prompts, max_new_tokens, key, Sampling(temperature=0.0, eos_id=end_id)))  # type: ignore[arg-type]
    ]
    if samples > 0:
        repeated = [p for p in prompts for _ in range(samples)]
        sampled = generation(
            repeated,
            max_new_tokens,
            jax.random.fold_in(key, 1),
            Sampling(temperature=temperature, eos_id=end_id),
        )
        assert isinstance(sampled, list)
        drawn += [sampled[k::samples] for k in range(samples)]
    reward = MathReward()
    pairs: list[Pair] = []
    for index, (question, prompt, reference, answer) in enumerate(items):
        right: list[list[int]] = []
        wrong: list[list[int]] = []
        for draws in drawn:
            ids = [int(i) for i in draws[index].ids]
            text = decode([i for i in ids if i != end_id])
            target = right if reward("quickstart", text, answer, "") > 0 else wrong
            if ids not in target:
                target.append(ids)
        candidates = right or [reference]
        for rejected in wrong:
            chosen = max(candidates, key=lambda c: common_prefix(c, rejected))
            at = parting_index(chosen, rejected)
            if at is None:
                continue
            pairs.append(
                Pair(
                    prompt=tuple(prompt),
                    prefix=tuple(chosen[:at]),
                    chosen_id=chosen[at],
                    rejected_id=rejected[at],
                    chosen_rest=tuple(chosen[at + 1 :]),
                    question=question,
                    chosen_text=decode([i for i in chosen if i != end_id]),
                    rejected_text=decode([i for i in rejected if i != end_id]),
                )
            )
    return pairs


def _margins(apply: Any, variables: Any, ids: jax.Array, at: jax.Array, pick: jax.Array) -> Any:
    logits = apply(variables, ids)
    rows = jnp.arange(ids.shape[0])
    log_probs = jax.nn.log_softmax(logits[rows, at].astype(jnp.float32), axis=-1)
    return log_probs[rows, pick[:, 0]] - log_probs[rows, pick[:, 1]]


class PreferenceCheck:
    """``check(variables) -> share`` of ``pairs`` whose right id outranks the wrong one.

    One forward pass over the contexts ``[N, W]`` (right-padded; the model is causal, so the
    padding never reaches the scored position); compiled once per instance.
    """

    def __init__(self, model: Any, pairs: Sequence[Pair], pad_id: int) -> None:
        if not pairs:
            raise ValueError("pairs: expected at least one pair to check, got none")
        width = max(len(p.context) for p in pairs)
        ids = np.full((len(pairs), width), pad_id, np.int32)
        for row, pair in enumerate(pairs):
            ids[row, : len(pair.context)] = pair.context
        self.ids = jnp.asarray(ids)
        self.at = jnp.asarray([len(p.context) - 1 for p in pairs], jnp.int32)
        self.pick = jnp.asarray([[p.chosen_id, p.rejected_id] for p in pairs], jnp.int32)
        self._margins = jax.jit(lambda v, i, a, p: _margins(model.apply, v, i, a, p))

    def margins(self, variables: Mapping[str, Any]) -> np.ndarray:
        """``[N]`` log-probability of the right id minus that of the wrong one, per pair."""
        return np.asarray(self._margins(variables, self.ids, self.at, self.pick))

    def __call__(self, variables: Mapping[str, Any]) -> float:
        return float(np.mean(self.margins(variables) > 0))

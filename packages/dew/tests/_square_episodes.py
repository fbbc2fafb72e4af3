"""A square tool as an in-process environment, and a scripted policy, for episode tests.

Ids: 0 pad, 1 EOS, 2 CALL, 3 SAY, 4..13 the digits 0-9, 14 QUESTION; vocabulary 16.
``reset`` shows ``[QUESTION, digit(x)]`` with ``x = task % 10``. A turn ``[CALL, EOS]`` asks
the tool: the reply appends the digits of ``x * x`` and keeps running. A turn
``[SAY, digits..., EOS]`` answers and completes the episode (its detail is the answer). Any
other turn completes it with an ``invalid`` detail. The verifier gives 1 to a correct answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dew.rollouts.episodes import Episode, EpisodeId, EpisodeStatus, Observation

PAD, EOS, CALL, SAY, QUESTION = 0, 1, 2, 3, 14
VOCAB = 16


def digits(n: int) -> list[int]:
    return [4 + int(c) for c in str(n)]


def number(ids: Any) -> str:
    return "".join(str(int(i) - 4) if 4 <= int(i) <= 13 else "?" for i in ids)


@dataclass
class Log:
    """Shared event log of every environment a factory made."""

    events: list[tuple[Any, ...]] = field(default_factory=list)
    open: set[EpisodeId] = field(default_factory=set)


class SquareEnvironment:
    def __init__(self, episode_id: EpisodeId, log: Log, fail_on: str | None = None) -> None:
        self.id = episode_id
        self.log = log
        self.fail_on = fail_on
        self.x = episode_id.task % 10
        self.calls = 0

    def __enter__(self) -> SquareEnvironment:
        self.log.events.append(("enter", self.id))
        self.log.open.add(self.id)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.log.events.append(("exit", self.id, exc))
        self.log.open.discard(self.id)
        if self.fail_on == "release":
            raise OSError("could not remove the workspace")

    def reset(self) -> Observation:
        self.log.events.append(("reset", self.id))
        return Observation([QUESTION, *digits(self.x)])

    def step(self, action: Any) -> Observation:
        self.log.events.append(("step", self.id, tuple(int(t) for t in action.tokens)))
        if self.fail_on is not None and self.fail_on != "release":
            raise _failure(self.fail_on)
        body = [int(t) for t in action.tokens if int(t) != EOS]
        if body == [CALL]:
            self.calls += 1
            context = [*np.asarray(action.context).tolist(), *action.tokens.tolist()]
            return Observation([*context, *digits(self.x * self.x)])
        if body[:1] == [SAY]:
            return Observation(None, EpisodeStatus.COMPLETED, number(body[1:]))
        return Observation(None, EpisodeStatus.COMPLETED, "invalid")


def _failure(kind: str) -> BaseException:
    import asyncio
    import concurrent.futures

    if kind == "asyncio":
        return asyncio.CancelledError("stop")
    if kind == "futures":
        return concurrent.futures.CancelledError("stop")
    return RuntimeError("the tool broke")


def square_verifier(episode: Episode) -> float:
    x = episode.id.task % 10
    return 1.0 if episode.detail == str(x * x) else 0.0


@dataclass
class ScriptedGeneration:
    ids: np.ndarray
    raw_log_probs: np.ndarray
    behavior_log_probs: np.ndarray
    eos: bool


class ScriptedPolicy:
    """Calls the tool once, then answers what the tool said; ``budget_cut`` stops early."""

    def __init__(self, answer_offset: int = 0) -> None:
        self.bound: list[Any] = []
        self.calls: list[tuple[int, list[int]]] = []
        self.answer_offset = answer_offset

    def bind(self, snapshot: Any) -> ScriptedPolicy:
        self.bound.append(snapshot)
        return self

    def __call__(self, contexts: Any, budgets: Any, key: Any, sampling: Any) -> list[Any]:
        self.calls.append((len(contexts), list(budgets)))
        out = []
        for context, budget in zip(contexts, budgets):
            context = [int(t) for t in context]
            if CALL not in context:
                ids = [CALL, EOS]
            else:
                result = number(context[context.index(CALL) + 2 :])
                answer = str(int(result) + self.answer_offset) if result.isdigit() else "0"
                ids = [SAY, *digits(int(answer)), EOS]
            ids = ids[:budget]
            n = len(ids)
            out.append(
                ScriptedGeneration(
                    np.asarray(ids, np.int32),
                    np.linspace(-0.5, -1.5, n).astype(np.float32),
                    np.linspace(-0.25, -0.75, n).astype(np.float32),
                    ids[-1] == EOS,
                )
            )
        return out

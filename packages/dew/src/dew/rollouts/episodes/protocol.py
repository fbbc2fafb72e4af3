"""The tool-episode protocol: what an environment, an action and an episode are (host side).

An episode alternates model turns and environment replies:

1. ``environment.reset()`` returns the first :class:`Observation` (its ``context`` is the
   token ids the policy reads first).
2. The policy samples an :class:`Action` from that exact context: the sampled ``tokens``
   (EOS kept as the last id when it ended the turn), one raw and one behavior log-probability
   per sampled id, ``terminated`` (EOS ended the turn) and the committed ``policy_step``.
3. ``environment.step(action)`` returns the next :class:`Observation`: ``RUNNING`` with the
   exact next context, or a terminal status (``COMPLETED``, ``TRUNCATED``, ``CANCELLED``,
   ``ERROR``) with a ``detail`` string.

Each (action, reply) pair is a :class:`Transition`; an :class:`Episode` is the identity, the
first observation, the transitions in order, the final status and detail, and the verifier's
reward once scored. Environments are context managers: entering acquires their resources,
exiting releases them (and is told the exception when the episode was aborted).
Environments that support a journal also implement ``get_state() -> bytes`` and
``set_state(bytes)``.

Records compare equal by value. Each action and episode also carries a private origin token
naming the collection (policy binding) that produced it; it never takes part in equality or
random draws, and only serves to refuse mixing records of separately bound policies.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dew.checks import is_integer
from dew.sessions.records import token_ids


class EpisodeStatus(enum.StrEnum):
    """Where an episode stands: still running or how it ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    CANCELLED = "cancelled"
    ERROR = "error"

    @property
    def terminal(self) -> bool:
        return self is not EpisodeStatus.RUNNING


def _status(value: Any, field_name: str) -> EpisodeStatus:
    try:
        return EpisodeStatus(value)
    except ValueError:
        names = ", ".join(s.name for s in EpisodeStatus)
        raise ValueError(f"{field_name}: expected one of {names}, got {value!r}") from None


def _plain_int(value: Any, field_name: str, *, minimum: int = 0) -> int:
    if not is_integer(value):
        raise TypeError(f"{field_name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field_name}: expected an integer >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class EpisodeId:
    """Who an episode is: the ``task`` id, the attempted training ``step`` (the attempt
    clock), the ``sample`` index inside the task's group and the environment's ``seed``."""

    task: int
    step: int
    sample: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("task", "step", "sample", "seed"):
            object.__setattr__(self, name, _plain_int(getattr(self, name), f"EpisodeId.{name}"))

    def as_dict(self) -> dict[str, int]:
        return {"task": self.task, "step": self.step, "sample": self.sample, "seed": self.seed}


def _arrays_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


@dataclass(frozen=True, eq=False)
class Observation:
    """An environment reply.

    Attributes:
      context: the exact token ids the policy reads next, ``[C]`` (required while
        ``RUNNING``; a terminal reply may carry one or ``None``).
      status: an :class:`EpisodeStatus`.
      detail: free text for the verifier and the logs (a result, a reason).
    """

    context: Any = None
    status: EpisodeStatus = EpisodeStatus.RUNNING
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status(self.status, "Observation.status"))
        if not isinstance(self.detail, str):
            raise TypeError(f"Observation.detail: expected a string, got {self.detail!r}")
        if self.context is None:
            if self.status is EpisodeStatus.RUNNING:
                raise ValueError(
                    "Observation.context: a RUNNING observation needs the next context, got None"
                )
            return
        ids = token_ids(self.context, "Observation.context")
        if ids.size == 0 and self.status is EpisodeStatus.RUNNING:
            raise ValueError("Observation.context: expected at least one id, got none")
        object.__setattr__(self, "context", ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Observation):
            return NotImplemented
        return (
            self.status is other.status
            and self.detail == other.detail
            and _arrays_equal(self.context, other.context)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class Action:
    """One model turn, exactly as sampled.

    Attributes:
      context: the ids the policy read, ``[C]`` int64.
      tokens: the ids it drew, ``[R]`` int64, EOS last when EOS ended the turn.
      raw_log_probs: ``[R]`` float64, the unmodified policy's likelihood of each id.
      behavior_log_probs: ``[R]`` float64, the likelihood under the sampling distribution.
      terminated: True when an EOS id ended the turn, False when the budget did.
      policy_step: the committed update clock of the weights that sampled it.

    Built unchecked; :func:`dew.rollouts.episodes.validation.check_action` is the
    one validation every live, imported or restored action goes through.
    """

    context: Any
    tokens: Any
    raw_log_probs: Any
    behavior_log_probs: Any
    terminated: bool
    policy_step: int = 0
    origin: Any = field(default=None, repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Action):
            return NotImplemented
        return (
            self.terminated == other.terminated
            and self.policy_step == other.policy_step
            and all(
                _arrays_equal(getattr(self, name), getattr(other, name))
                for name in ("context", "tokens", "raw_log_probs", "behavior_log_probs")
            )
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Transition:
    """One action and the observation the environment answered it with."""

    action: Action
    observation: Observation


@dataclass(frozen=True, eq=False)
class Episode:
    """A (possibly partial) episode.

    Attributes:
      id: its :class:`EpisodeId`.
      first: the observation ``reset()`` returned (``None`` if reset never answered).
      transitions: every :class:`Transition` in order.
      status: RUNNING while collecting; the terminal status once it ended.
      detail: the terminal observation's detail (or the reason Dew ended it).
      reward: the verifier's score, ``None`` until verified (and for episodes that never are).
    """

    id: EpisodeId
    first: Observation | None = None
    transitions: tuple[Transition, ...] = ()
    status: EpisodeStatus = EpisodeStatus.RUNNING
    detail: str = ""
    reward: float | None = None
    origin: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status(self.status, "Episode.status"))
        object.__setattr__(self, "transitions", tuple(self.transitions))
        if self.reward is not None:
            reward = float(self.reward)
            if not math.isfinite(reward):
                raise ValueError(f"Episode.reward: expected a finite number, got {self.reward!r}")
            object.__setattr__(self, "reward", reward)

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(t.action for t in self.transitions)

    @property
    def turns(self) -> int:
        return len(self.transitions)

    @property
    def last_observation(self) -> Observation | None:
        return self.transitions[-1].observation if self.transitions else self.first

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Episode):
            return NotImplemented
        return (
            self.id == other.id
            and self.first == other.first
            and self.transitions == other.transitions
            and self.status is other.status
            and self.detail == other.detail
            and self.reward == other.reward
        )

    __hash__ = None  # type: ignore[assignment]


@runtime_checkable
class Environment(Protocol):
    """What an episode talks to: a context manager with ``reset`` and ``step``.

    ``__enter__`` returns the object to talk to (usually itself); ``__exit__`` releases every
    resource and receives the exception that aborted the episode, if any. Optional:
    ``get_state() -> bytes`` and ``set_state(bytes) -> None`` (needed with a journal).
    """

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...

    def reset(self) -> Observation: ...

    def step(self, action: Action) -> Observation: ...


EnvironmentFactory = Callable[[EpisodeId], Environment]
"""Called once per episode with its identity; returns a fresh :class:`Environment`."""

Verifier = Callable[[Episode], float]
"""Scores an episode (finished, truncated or errored) with a finite float, while the
environment is still open."""

Record = Callable[[Episode], None]
"""Receives every finished episode (scored or discarded) and every failed partial episode."""


def as_observation(value: Any, field_name: str) -> Observation:
    """Accept an :class:`Observation` (or a duck-typed one with context/status/detail)."""
    if isinstance(value, Observation):
        return value
    if all(hasattr(value, name) for name in ("status", "detail")):
        return Observation(
            context=getattr(value, "context", None), status=value.status, detail=value.detail
        )
    raise TypeError(f"{field_name}: expected an Observation, got {type(value).__name__}")


__all__ = [
    "Action",
    "Environment",
    "EnvironmentFactory",
    "Episode",
    "EpisodeId",
    "EpisodeStatus",
    "Observation",
    "Record",
    "Transition",
    "Verifier",
    "as_observation",
]

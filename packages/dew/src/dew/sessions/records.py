"""Session records: engine calls, harness sessions and their validation (host side).

A ``Call`` is one request to an inference engine: the ``prompt_ids`` it read, the
``sampled_ids`` it drew (EOS included when it stopped naturally) and one behavior
log-probability per sampled id. A ``Session`` is one harness run over a ``Task``: its calls in
submission order, a ``Status`` and the verifier's reward. Both check their fields when built,
so a bad record fails where it is made, naming the field.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dew.checks import is_integer


class Status(enum.StrEnum):
    """How a session ended."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    AGENT_ERROR = "agent_error"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Task:
    """A unit of work a session source runs: an id and whatever payload its harness reads."""

    id: Hashable
    data: Any = None


def token_ids(value: Any, field_name: str, *, allow_empty: bool = True) -> np.ndarray:
    """Token ids as a 1-D int64 array; refuses booleans, negatives, non-integers and strings.

    Errors are ``TypeError`` (wrong kind) or ``ValueError`` (wrong shape, negative id, empty
    when ``allow_empty`` is off), each naming ``field_name`` (and the position of a bad id).
    """
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_ or value.dtype.kind not in "iu":
            raise TypeError(f"{field_name}: expected integer token ids, got dtype {value.dtype}")
        if value.ndim != 1:
            raise ValueError(
                f"{field_name}: expected a 1-D sequence of ids, got shape {value.shape}"
            )
        array = value.astype(np.int64)
    else:
        if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
            raise TypeError(f"{field_name}: expected a sequence of token ids, got {value!r}")
        items = list(value)
        for position, item in enumerate(items):
            if not is_integer(item):
                raise TypeError(
                    f"{field_name}[{position}]: expected an integer token id, got {item!r}"
                )
        array = np.asarray(items, dtype=np.int64).reshape(-1)
    if not allow_empty and array.size == 0:
        raise ValueError(f"{field_name}: expected at least one id, got none")
    if array.size and array.min() < 0:
        bad = int(np.argmax(array < 0))
        raise ValueError(f"{field_name}[{bad}]: expected a nonnegative id, got {array[bad]}")
    return array


def _likelihoods(value: Any, field_name: str, length: int) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if array.shape[0] != length:
        raise ValueError(
            f"{field_name}: expected one value per sampled id ({length}), got {array.shape[0]}"
        )
    if not np.all(np.isfinite(array)):
        bad = int(np.argmin(np.isfinite(array)))
        raise ValueError(
            f"{field_name}[{bad}]: expected a finite log-probability, got {array[bad]}"
        )
    return array


@dataclass(frozen=True, eq=False)
class Call:
    """One engine request and what it drew.

    Attributes:
      prompt_ids: the ids the engine read, ``[P]``, nonempty.
      sampled_ids: the ids it drew, ``[R]`` (EOS included on a natural stop; may be empty for a
        call aborted before its first token).
      behavior_log_probs: ``[R]`` likelihoods the engine reported for the sampled ids (after its
        temperature and filters).
      finish_reason: ``"stop"`` (EOS), ``"length"`` (budget) or an engine-specific string.
      version: the policy version served when the request was submitted.
      raw_log_probs: optional ``[R]`` raw-policy likelihoods (the model's softmax before any
        sampling transform); packed as ``old_log_probs`` when every call has them.
      routed_experts: optional ``[P + R, layers, top_k]`` or ``[R, layers, top_k]`` expert ids.
      support: optional, one sequence of kept ids per sampled id (the set it was drawn from).
    """

    prompt_ids: Any
    sampled_ids: Any
    behavior_log_probs: Any
    finish_reason: str = "stop"
    version: int = 0
    raw_log_probs: Any = None
    routed_experts: Any = None
    support: Any = None

    def __post_init__(self) -> None:
        prompt = token_ids(self.prompt_ids, "Call.prompt_ids", allow_empty=False)
        sampled = token_ids(self.sampled_ids, "Call.sampled_ids")
        object.__setattr__(self, "prompt_ids", prompt)
        object.__setattr__(self, "sampled_ids", sampled)
        object.__setattr__(
            self,
            "behavior_log_probs",
            _likelihoods(self.behavior_log_probs, "Call.behavior_log_probs", sampled.size),
        )
        if self.raw_log_probs is not None:
            object.__setattr__(
                self,
                "raw_log_probs",
                _likelihoods(self.raw_log_probs, "Call.raw_log_probs", sampled.size),
            )
        if not isinstance(self.finish_reason, str):
            raise TypeError(f"Call.finish_reason: expected a string, got {self.finish_reason!r}")
        if not is_integer(self.version):
            raise TypeError(f"Call.version: expected an integer, got {self.version!r}")
        if self.version < 0:
            raise ValueError(f"Call.version: expected a nonnegative version, got {self.version}")
        object.__setattr__(self, "version", int(self.version))
        if self.routed_experts is not None:
            routed = np.asarray(self.routed_experts)
            if routed.ndim != 3 or routed.shape[0] not in (
                prompt.size + sampled.size,
                sampled.size,
            ):
                raise ValueError(
                    "Call.routed_experts: expected [prompt + sampled ids, layers, top_k] or "
                    f"[sampled ids, layers, top_k] = [{prompt.size + sampled.size} or "
                    f"{sampled.size}, L, K], got shape {routed.shape}"
                )
            object.__setattr__(self, "routed_experts", routed)
        if self.support is not None:
            kept = tuple(self.support)
            if len(kept) != sampled.size:
                raise ValueError(
                    f"Call.support: expected one kept-id set per sampled id ({sampled.size}), "
                    f"got {len(kept)}"
                )
            sets = []
            for position, ids in enumerate(kept):
                array = token_ids(ids, f"Call.support[{position}]", allow_empty=False)
                if sampled[position] not in array:
                    raise ValueError(
                        f"Call.support[{position}]: the sampled id {sampled[position]} is not in "
                        "its own support"
                    )
                sets.append(array)
            object.__setattr__(self, "support", tuple(sets))

    def check_eos(self, eos_ids: Iterable[int]) -> None:
        """Refuse ids after EOS and a finish reason that disagrees with the last id."""
        eos = np.asarray(sorted(set(int(i) for i in eos_ids)), dtype=np.int64)
        if eos.size == 0 or self.sampled_ids.size == 0:
            return
        hits = np.isin(self.sampled_ids, eos)
        if hits[:-1].any():
            first = int(np.argmax(hits))
            raise ValueError(
                f"Call.sampled_ids: EOS id {self.sampled_ids[first]} at position {first} is "
                f"followed by {self.sampled_ids.size - first - 1} more ids"
            )
        if hits[-1] and self.finish_reason != "stop":
            raise ValueError(
                f"Call.finish_reason: the last sampled id is EOS, so expected 'stop', got "
                f"{self.finish_reason!r}"
            )
        if not hits[-1] and self.finish_reason == "stop":
            raise ValueError(
                "Call.finish_reason: 'stop' but the last sampled id "
                f"{self.sampled_ids[-1]} is not an EOS id"
            )


@dataclass(frozen=True, eq=False, kw_only=True)
class Session:
    """One harness session: its calls in submission order, how it ended and its reward.

    A session that made no engine call (a flow model's sample, drawn by the trainer's own
    sampler) carries what it drew in ``payload`` and the policy version it was drawn with in
    ``version``; ``policy_versions`` reads either kind.
    """

    task: Hashable
    group: int = 0
    sample: int = 0
    attempt: int = 0
    calls: Sequence[Call] = ()
    status: Status = Status.COMPLETED
    reward: float | None = None
    components: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""
    version: int | None = None
    payload: Any = None

    def __post_init__(self) -> None:
        try:
            status = Status(self.status)
        except ValueError as err:
            names = ", ".join(s.name for s in Status)
            raise ValueError(
                f"Session.status: expected one of {names}, got {self.status!r}"
            ) from err
        object.__setattr__(self, "status", status)
        calls = tuple(self.calls)
        for position, call in enumerate(calls):
            if not isinstance(call, Call):
                raise TypeError(f"Session.calls[{position}]: expected a Call, got {type(call)}")
        object.__setattr__(self, "calls", calls)
        for name in ("group", "sample", "attempt"):
            value = getattr(self, name)
            if not is_integer(value):
                raise TypeError(f"Session.{name}: expected an integer, got {value!r}")
        if self.reward is not None:
            reward = float(self.reward)
            if not math.isfinite(reward):
                raise ValueError(f"Session.reward: expected a finite number, got {self.reward!r}")
            object.__setattr__(self, "reward", reward)
        components = {str(k): float(v) for k, v in dict(self.components).items()}
        for name, value in components.items():
            if not math.isfinite(value):
                raise ValueError(f"Session.components[{name!r}]: expected finite, got {value}")
        object.__setattr__(self, "components", components)
        if self.version is not None:
            if not is_integer(self.version) or self.version < 0:
                raise ValueError(
                    f"Session.version: expected None or a nonnegative integer, got {self.version!r}"
                )
            object.__setattr__(self, "version", int(self.version))

    def policy_versions(self) -> list[int]:
        """The policy versions this session drew with: one per call, then ``version`` if set."""
        versions = [call.version for call in self.calls]
        return versions if self.version is None else [*versions, self.version]


def check_choice(value: str, choices: tuple[str, ...], field_name: str) -> None:
    """Raise a ValueError naming ``field_name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{field_name}: expected one of {', '.join(choices)}, got {value!r}")


__all__ = ["Call", "Session", "Status", "Task", "check_choice", "token_ids"]

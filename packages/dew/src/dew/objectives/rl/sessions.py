"""Engine calls, harness sessions and the packer that turns them into GRPO rows (host side).

A ``Call`` is one request to an inference engine: the ``prompt_ids`` it read, the
``sampled_ids`` it drew (EOS included when it stopped naturally) and one behavior
log-probability per sampled id. A ``Session`` is one harness run over a ``Task``: its calls in
submission order, a ``Status`` and the verifier's reward.

``pack`` builds one training batch out of sessions:

1. Which sessions train. COMPLETED and AGENT_ERROR always train on their reward; INFRA_ERROR
   and CANCELLED never do (no rows, no part in any baseline). ``truncation`` decides TRUNCATED:
   ``"mask"`` drops them, ``"score"`` trains them on their reward, ``"zero"`` on reward 0.
2. Advantages, group-relative over ``(task, group)`` among the training sessions, ported from
   verl 0.9.1 ``compute_grpo_outcome_advantage`` (``"group"``: unbiased std + 1e-6;
   ``"mean"``: centred only, verl's ``norm_adv_by_std_in_grpo=False``, Dr.GRPO) and
   ``compute_rloo_outcome_advantage`` (``"rloo"``). As in verl a group of one has baseline 0
   (and deviation 1), so its advantage is its reward.
3. Chains. Call ``k + 1`` joins call ``k``'s chain only when its prompt starts with every id of
   the chain so far, sampled ids included; otherwise it opens a new chain. A prompt that merely
   shares the earlier *prompt* never merges: that would splice sampled ids into a context the
   model did not read.
4. Rows. Chains are placed first-fit decreasing (longest first, each in the first row with
   room) into ``[rows, width]``; ``text_segment_ids`` (1, 2, ... per row, 0 = padding) and
   ``text_positions`` (restarting at 0 per chain) keep attention and positions inside a chain.

Every column is ``[rows, width]`` and aligned with ``input_ids``:

- ``input_ids`` (int32, 0 on padding), ``text_segment_ids``, ``text_positions`` (int32)
- ``response_mask`` (int32 0/1): 1 on sampled ids, EOS included
- ``behavior_log_probs`` (float32): the engine's likelihood of each sampled id, 0 elsewhere
- ``old_log_probs`` (float32): only when every packed call carries ``raw_log_probs``
- ``versions``, ``session_index``, ``call_index`` (int32): on sampled ids, -1 elsewhere;
  ``session_index`` is the session's position in the ``sessions`` argument
- ``advantages`` (float32): the session's advantage over its whole chain, 0 on padding
- ``session_weights`` (float32): ``1 / n`` on each of a session's ``n`` sampled ids, so summing
  ``x * session_weights`` over a batch and dividing by the session count is a session mean
- ``routed_experts`` ``[rows, width, layers, top_k]`` (the engine's dtype) and ``routed``
  (bool) when any call recorded routing
- ``support_ids``/``support_columns`` ``[rows, support_capacity]`` (int32, -1 padded) when
  any call recorded its sampling support: each row's kept ids back to back, each tagged with the
  column of the sampled id it was kept for.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ESTIMATORS = ("group", "mean", "rloo")
TRUNCATIONS = ("mask", "score", "zero")
GROUP_EPSILON = 1e-6


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


def _ids(value: Any, field_name: str, *, allow_empty: bool) -> np.ndarray:
    """Token ids as a 1-D int64 array; booleans, negatives and non-integers are refused."""
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_ or value.dtype.kind not in "iu":
            raise TypeError(f"{field_name}: expected integer token ids, got dtype {value.dtype}")
        array = value.astype(np.int64).reshape(-1) if value.ndim == 1 else None
        if array is None:
            raise ValueError(
                f"{field_name}: expected a 1-D sequence of ids, got shape {value.shape}"
            )
    else:
        items = list(value)
        for position, item in enumerate(items):
            if isinstance(item, bool | np.bool_) or not isinstance(item, int | np.integer):
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
        prompt = _ids(self.prompt_ids, "Call.prompt_ids", allow_empty=False)
        sampled = _ids(self.sampled_ids, "Call.sampled_ids", allow_empty=True)
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
        if isinstance(self.version, bool) or not isinstance(self.version, int | np.integer):
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
                array = _ids(ids, f"Call.support[{position}]", allow_empty=False)
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
    """One harness session: its calls in submission order, how it ended and its reward."""

    task: Hashable
    group: int = 0
    sample: int = 0
    attempt: int = 0
    calls: Sequence[Call] = ()
    status: Status = Status.COMPLETED
    reward: float | None = None
    components: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""

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
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
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


def _check_choice(value: str, choices: tuple[str, ...], field_name: str) -> None:
    if value not in choices:
        raise ValueError(f"{field_name}: expected one of {choices}, got {value!r}")


def _trains(session: Session, truncation: str) -> bool:
    if session.status in (Status.COMPLETED, Status.AGENT_ERROR):
        return True
    if session.status is Status.TRUNCATED:
        return truncation != "mask"
    return False


def _training_reward(session: Session, truncation: str, index: int) -> float:
    if session.status is Status.TRUNCATED and truncation == "zero":
        return 0.0
    if session.reward is None:
        raise ValueError(
            f"sessions[{index}].reward: a {session.status.name} session trains, so it needs a "
            "reward, got None"
        )
    return float(session.reward)


def group_advantages(
    rewards: Sequence[float], keys: Sequence[Hashable], estimator: str
) -> np.ndarray:
    """Advantages of ``[S]`` rewards grouped by ``keys`` (ragged groups allowed), float64.

    Ported from verl 0.9.1 ``compute_grpo_outcome_advantage`` and
    ``compute_rloo_outcome_advantage``: a group of one keeps its reward (baseline 0, deviation
    1); ``"group"`` divides by the unbiased deviation plus 1e-6, so a group of equal rewards gets
    zero advantages.
    """
    _check_choice(estimator, ESTIMATORS, "estimator")
    values = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(values)
    members: dict[Hashable, list[int]] = {}
    for position, key in enumerate(keys):
        members.setdefault(key, []).append(position)
    for idx in members.values():
        group = values[idx]
        n = group.size
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = float(group.mean()), float(group.std(ddof=1))
        if estimator == "group":
            out[idx] = (group - mean) / (std + GROUP_EPSILON)
        elif estimator == "mean":
            out[idx] = group - mean
        else:
            out[idx] = group if n == 1 else (group - mean) * n / (n - 1)
    return out


@dataclass
class _Chain:
    """One chain under construction: ids plus per-id metadata (host lists)."""

    session: int
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    behavior: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    routed: dict[int, np.ndarray] = field(default_factory=dict)
    support: dict[int, np.ndarray] = field(default_factory=dict)
    n_calls: int = 0

    def extend(self, call: Call, call_index: int) -> None:
        start = len(self.ids)
        fresh = call.prompt_ids[start:]
        self.ids.extend(int(i) for i in fresh)
        self.sampled.extend([False] * fresh.size)
        self.behavior.extend([0.0] * fresh.size)
        self.raw.extend([0.0] * fresh.size)
        self.versions.extend([-1] * fresh.size)
        self.calls.extend([-1] * fresh.size)
        sampled_start = len(self.ids)
        n = call.sampled_ids.size
        self.ids.extend(int(i) for i in call.sampled_ids)
        self.sampled.extend([True] * n)
        self.behavior.extend(float(x) for x in call.behavior_log_probs)
        raw = call.raw_log_probs if call.raw_log_probs is not None else np.zeros(n)
        self.raw.extend(float(x) for x in raw)
        self.versions.extend([call.version] * n)
        self.calls.extend([call_index] * n)
        if call.routed_experts is not None:
            record = call.routed_experts
            offset = 0 if record.shape[0] == call.prompt_ids.size + n else sampled_start
            for j in range(record.shape[0]):
                self.routed[offset + j] = record[j]
        if call.support is not None:
            for j, kept in enumerate(call.support):
                self.support[sampled_start + j] = kept
        self.n_calls += 1


def _chains_of(session: Session, index: int) -> list[_Chain]:
    chains: list[_Chain] = []
    current: _Chain | None = None
    for call_index, call in enumerate(session.calls):
        so_far = current.ids if current is not None else None
        extends = (
            so_far is not None
            and call.prompt_ids.size >= len(so_far)
            and np.array_equal(call.prompt_ids[: len(so_far)], np.asarray(so_far, dtype=np.int64))
        )
        if not extends:
            current = _Chain(session=index)
            chains.append(current)
        assert current is not None
        current.extend(call, call_index)
    return chains


def _training_chains(
    sessions: Sequence[Session], width: int, truncation: str, eos_ids: Iterable[int] | None
) -> list[_Chain]:
    eos = tuple(eos_ids) if eos_ids is not None else ()
    chains: list[_Chain] = []
    for index, session in enumerate(sessions):
        if not isinstance(session, Session):
            raise TypeError(f"sessions[{index}]: expected a Session, got {type(session)}")
        if not _trains(session, truncation):
            continue
        for call_index, call in enumerate(session.calls):
            try:
                call.check_eos(eos)
            except ValueError as err:
                raise ValueError(f"sessions[{index}].calls[{call_index}]: {err}") from None
        for chain in _chains_of(session, index):
            if len(chain.ids) > width:
                raise ValueError(
                    f"sessions[{index}]: a chain of {len(chain.ids)} ids does not fit a row of "
                    f"width {width}"
                )
            chains.append(chain)
    return chains


def _check_width(width: int) -> int:
    if isinstance(width, bool) or not isinstance(width, int | np.integer) or width < 2:
        raise ValueError(f"width: expected an integer >= 2, got {width!r}")
    return int(width)


def chain_lengths(sessions: Sequence[Session], width: int, truncation: str = "mask") -> list[int]:
    """Length of every chain ``pack`` would place, in session order; raises on a chain > width."""
    width = _check_width(width)
    _check_choice(truncation, TRUNCATIONS, "truncation")
    return [len(c.ids) for c in _training_chains(sessions, width, truncation, None)]


def _first_fit(lengths: Sequence[int], width: int) -> tuple[list[tuple[int, int]], int]:
    """First-fit decreasing placement: ``(row, offset)`` per length and the row count."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    free: list[int] = []
    placement: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in order:
        length = lengths[i]
        if length > width:
            raise ValueError(f"chain_lengths[{i}]: {length} ids do not fit a row of width {width}")
        for row, room in enumerate(free):
            if room >= length:
                placement[i] = (row, width - room)
                free[row] = room - length
                break
        else:
            placement[i] = (len(free), 0)
            free.append(width - length)
    return placement, len(free)


def rows_needed(lengths: Sequence[int], width: int) -> int:
    """Rows ``pack`` fills for chains of these lengths (first-fit decreasing)."""
    width = _check_width(width)
    return _first_fit([int(n) for n in lengths], width)[1]


def pack(
    sessions: Sequence[Session],
    width: int,
    rows: int | None = None,
    estimator: str = "group",
    truncation: str = "mask",
    support_capacity: int | None = None,
    eos_ids: int | Iterable[int] | None = None,
) -> dict[str, np.ndarray]:
    """Pack sessions into one ``[rows, width]`` GRPO batch (see the module docstring).

    Args:
      sessions: the sessions of one batch; ``session_index`` refers to positions in it.
      width: row width W (``GRPOObjective.seq_len + 1``).
      rows: fixed row count N; ``None`` uses as many as the chains need. Too few raises.
      estimator: ``"group"``, ``"mean"`` or ``"rloo"``.
      truncation: ``"mask"``, ``"score"`` or ``"zero"`` for TRUNCATED sessions.
      support_capacity: width of ``support_ids``; required when a call recorded a support.
      eos_ids: when given, every packed call is checked: no id after EOS, and a ``"stop"``
        finish reason exactly when the last sampled id is EOS.
    """
    width = _check_width(width)
    _check_choice(estimator, ESTIMATORS, "estimator")
    _check_choice(truncation, TRUNCATIONS, "truncation")
    if rows is not None and (
        isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1
    ):
        raise ValueError(f"rows: expected None or a positive integer, got {rows!r}")
    if isinstance(eos_ids, int | np.integer):
        eos_ids = (int(eos_ids),)
    sessions = list(sessions)
    chains = _training_chains(sessions, width, truncation, eos_ids)

    trained = [i for i, s in enumerate(sessions) if _trains(s, truncation)]
    rewards = [_training_reward(sessions[i], truncation, i) for i in trained]
    keys = [(sessions[i].task, sessions[i].group) for i in trained]
    advantage_of = dict(zip(trained, group_advantages(rewards, keys, estimator).tolist()))

    placement, needed = _first_fit([len(c.ids) for c in chains], width)
    if rows is None:
        rows = max(needed, 1)
    elif needed > rows:
        raise ValueError(f"rows: the chains need {needed} rows of width {width}, got rows={rows}")
    rows = int(rows)

    shape = (rows, width)
    batch: dict[str, np.ndarray] = {
        "input_ids": np.zeros(shape, np.int32),
        "text_segment_ids": np.zeros(shape, np.int32),
        "text_positions": np.zeros(shape, np.int32),
        "response_mask": np.zeros(shape, np.int32),
        "behavior_log_probs": np.zeros(shape, np.float32),
        "versions": np.full(shape, -1, np.int32),
        "session_index": np.full(shape, -1, np.int32),
        "call_index": np.full(shape, -1, np.int32),
        "advantages": np.zeros(shape, np.float32),
        "session_weights": np.zeros(shape, np.float32),
    }
    packed_calls = [c for i in trained for c in sessions[i].calls]
    with_raw = [c.raw_log_probs is not None for c in packed_calls]
    if any(with_raw) and not all(with_raw):
        raise ValueError(
            "Call.raw_log_probs: either every packed call carries raw log-probabilities or none "
            f"does; {sum(with_raw)} of {len(with_raw)} do"
        )
    if packed_calls and all(with_raw):
        batch["old_log_probs"] = np.zeros(shape, np.float32)
    records = [c.routed_experts for c in packed_calls if c.routed_experts is not None]
    if records:
        inner, dtype = records[0].shape[1:], records[0].dtype
        for record in records:
            if record.shape[1:] != inner or record.dtype != dtype:
                raise ValueError(
                    "Call.routed_experts: every record must share [layers, top_k] and dtype; got "
                    f"{inner}/{dtype} and {record.shape[1:]}/{record.dtype}"
                )
        batch["routed_experts"] = np.zeros(shape + inner, dtype)
        batch["routed"] = np.zeros(shape, np.bool_)
    has_support = any(c.support is not None for c in packed_calls)
    if has_support:
        if support_capacity is None or isinstance(support_capacity, bool) or support_capacity < 1:
            raise ValueError(
                "support_capacity: calls recorded sampling supports, so a positive capacity is "
                f"required, got {support_capacity!r}"
            )
        batch["support_ids"] = np.full((rows, int(support_capacity)), -1, np.int32)
        batch["support_columns"] = np.full((rows, int(support_capacity)), -1, np.int32)

    sampled_count: dict[int, int] = {}
    for chain in chains:
        sampled_count[chain.session] = sampled_count.get(chain.session, 0) + sum(chain.sampled)

    # segment ids count 1, 2, ... from the left of each row
    segment_of = [0] * len(chains)
    counters = [0] * rows
    for i in sorted(range(len(chains)), key=lambda i: placement[i]):
        counters[placement[i][0]] += 1
        segment_of[i] = counters[placement[i][0]]
    support_fill = [0] * rows
    for i, (chain, (row, offset)) in enumerate(zip(chains, placement)):
        n = len(chain.ids)
        cols = slice(offset, offset + n)
        sampled = np.asarray(chain.sampled, dtype=bool)
        batch["input_ids"][row, cols] = chain.ids
        batch["text_segment_ids"][row, cols] = segment_of[i]
        batch["text_positions"][row, cols] = np.arange(n)
        batch["response_mask"][row, cols] = sampled
        batch["behavior_log_probs"][row, cols] = chain.behavior
        if "old_log_probs" in batch:
            batch["old_log_probs"][row, cols] = chain.raw
        batch["versions"][row, cols] = chain.versions
        batch["session_index"][row, cols] = np.where(sampled, chain.session, -1)
        batch["call_index"][row, cols] = chain.calls
        batch["advantages"][row, cols] = advantage_of[chain.session]
        count = sampled_count[chain.session]
        if count:
            batch["session_weights"][row, cols] = np.where(sampled, 1.0 / count, 0.0)
        for position, record in chain.routed.items():
            batch["routed_experts"][row, offset + position] = record
            batch["routed"][row, offset + position] = True
        for position in sorted(chain.support):
            kept = chain.support[position]
            start = support_fill[row]
            if start + kept.size > batch["support_ids"].shape[1]:
                raise ValueError(
                    f"support_capacity: row {row} needs more than {support_capacity} kept ids "
                    f"(at least {start + kept.size})"
                )
            batch["support_ids"][row, start : start + kept.size] = kept
            batch["support_columns"][row, start : start + kept.size] = offset + position
            support_fill[row] = start + kept.size
    if has_support:
        missing = [
            i for i, c in enumerate(packed_calls) if c.support is None and c.sampled_ids.size > 0
        ]
        if missing:
            raise ValueError(
                "Call.support: either every packed call records its sampling support or none "
                f"does; {len(missing)} packed calls have none"
            )
    return batch


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def session_metrics(
    sessions: Sequence[Session],
    batch: Mapping[str, np.ndarray] | None = None,
    latencies: Sequence[float] | None = None,
    version: int | None = None,
    truncation: str = "mask",
) -> dict[str, float]:
    """Host-side diagnostics of one batch of sessions (plain floats).

    - ``sessions/count``, ``sessions/trained``, ``sessions/status/<name>`` (counts)
    - ``sessions/calls_per_chain``: mean calls per chain over the training sessions
    - ``sessions/masked_share/<name>``: share of all sampled ids that belong to non-training
      sessions of that status
    - ``reward/mean`` and ``reward/<component>`` over the sessions with a reward
    - ``latency/p50``, ``latency/p90``, ``latency/p99``, ``latency/max`` when latencies are given
    - ``version/lag_mean``, ``version/lag_max`` (``version`` minus a session's oldest call
      version) when ``version`` is given
    - ``packing/density`` (share of cells holding ids) and ``packing/rows`` when a batch is given
    """
    _check_choice(truncation, TRUNCATIONS, "truncation")
    sessions = list(sessions)
    out: dict[str, float] = {"sessions/count": float(len(sessions))}
    trained = [s for s in sessions if _trains(s, truncation)]
    out["sessions/trained"] = float(len(trained))
    for status in Status:
        out[f"sessions/status/{status.value}"] = float(sum(s.status is status for s in sessions))
    chains = [c for i, s in enumerate(sessions) if _trains(s, truncation) for c in _chains_of(s, i)]
    out["sessions/calls_per_chain"] = float(np.mean([c.n_calls for c in chains])) if chains else 0.0
    total = sum(c.sampled_ids.size for s in sessions for c in s.calls)
    for status in Status:
        dropped = sum(
            c.sampled_ids.size
            for s in sessions
            if s.status is status and not _trains(s, truncation)
            for c in s.calls
        )
        out[f"sessions/masked_share/{status.value}"] = float(dropped / total) if total else 0.0
    rewarded = [s for s in sessions if s.reward is not None]
    out["reward/mean"] = float(np.mean([s.reward for s in rewarded])) if rewarded else 0.0
    names = sorted({name for s in sessions for name in s.components})
    for name in names:
        values = [s.components[name] for s in sessions if name in s.components]
        out[f"reward/{name}"] = float(np.mean(values))
    if latencies is not None:
        lat = np.asarray(list(latencies), dtype=np.float64)
        if lat.shape[0] != len(sessions):
            raise ValueError(
                f"latencies: expected one latency per session ({len(sessions)}), got {lat.shape[0]}"
            )
        for q in (50, 90, 99):
            out[f"latency/p{q}"] = _percentile(lat, q)
        out["latency/max"] = float(lat.max()) if lat.size else 0.0
    if version is not None:
        lags = [version - min(c.version for c in s.calls) for s in sessions if s.calls]
        out["version/lag_mean"] = float(np.mean(lags)) if lags else 0.0
        out["version/lag_max"] = float(max(lags)) if lags else 0.0
    if batch is not None:
        segments = np.asarray(batch["text_segment_ids"])
        out["packing/density"] = float((segments > 0).mean()) if segments.size else 0.0
        out["packing/rows"] = float(segments.shape[0])
    return out


__all__ = [
    "Call",
    "ESTIMATORS",
    "Session",
    "Status",
    "TRUNCATIONS",
    "Task",
    "chain_lengths",
    "group_advantages",
    "pack",
    "rows_needed",
    "session_metrics",
]

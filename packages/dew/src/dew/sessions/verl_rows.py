"""Reading one verl ``AgentLoopOutput`` row: field checks and the runs of sampled ids (host side).

A row is what verl 0.9.1's ``verl.experimental.agent_loop.agent_loop.AgentLoopOutput`` holds,
as a mapping (``model_dump()``) or the pydantic object itself:

- ``prompt_ids`` ``[P]`` and ``response_ids`` ``[R]`` (ints), ``response_mask`` ``[R]`` (1 on
  ids the model sampled, 0 on tool or user ids the loop appended);
- ``response_logprobs`` ``[R]`` (the engine's log-probabilities, 0.0 off the mask) or ``None``;
- ``routed_experts`` ``[n, layers, top_k]`` over the first ``n`` ids of prompt + response, or
  ``None``;
- ``reward_score``, ``num_turns``, ``metrics``, ``extra_fields`` (verl keeps the policy versions
  a trajectory was drawn across as ``extra_fields["min_global_steps"]`` and
  ``["max_global_steps"]``), and the media fields ``multi_modal_data``,
  ``mm_processor_kwargs``, ``mm_processor_output``.

``native_calls`` and ``dew_calls`` turn a checked row into ``Call`` records (see
``dew.sessions.verl`` for the rules). Every refusal is a :class:`VerlRowError`
naming the row and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.checks import is_integer
from dew.sessions.records import Call, token_ids

TOKEN_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "routed_experts",
    "reward_score",
    "extra_fields",
)
MEDIA_FIELDS = ("multi_modal_data", "mm_processor_kwargs", "mm_processor_output")


class VerlRowError(ValueError):
    """A verl row Dew cannot import; ``row`` and ``field`` say where."""

    def __init__(self, row: int, field: str, message: str) -> None:
        super().__init__(f"rows[{row}].{field}: {message}")
        self.row = row
        self.field = field


def as_mapping(row: Any, index: int) -> dict[str, Any]:
    """The row's fields as a plain dict (a pydantic ``AgentLoopOutput`` is dumped unchanged)."""
    if hasattr(row, "model_dump") and not isinstance(row, Mapping):
        row = row.model_dump()
    if not isinstance(row, Mapping):
        raise TypeError(f"rows[{index}]: expected a mapping of AgentLoopOutput fields, got {row!r}")
    return dict(row)


def has_media(row: Mapping[str, Any]) -> list[str]:
    """The media fields a row carries (empty mappings and ``None`` carry nothing)."""
    carried = []
    for name in MEDIA_FIELDS:
        value = row.get(name)
        if value is None:
            continue
        if isinstance(value, Mapping | list | tuple) and len(value) == 0:
            continue
        carried.append(name)
    return carried


def _ids(row: Mapping[str, Any], index: int, name: str) -> np.ndarray:
    if row.get(name) is None:
        raise VerlRowError(index, name, "expected a list of token ids, got none")
    try:
        return token_ids(row[name], name)
    except (TypeError, ValueError) as err:
        raise VerlRowError(index, name, str(err).split(": ", 1)[-1]) from None


def tokens(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The checked token fields: ``prompt``, ``response``, ``mask`` (bool) and ``logprobs``."""
    prompt = _ids(row, index, "prompt_ids")
    response = _ids(row, index, "response_ids")
    if prompt.size == 0:
        raise VerlRowError(index, "prompt_ids", "expected at least one id, got none")
    raw_mask = row.get("response_mask")
    if raw_mask is None:
        raise VerlRowError(index, "response_mask", "expected one 0/1 flag per response id")
    mask = np.asarray(raw_mask).reshape(-1)
    if mask.shape[0] != response.size:
        raise VerlRowError(
            index,
            "response_mask",
            f"expected {response.size} flags (one per response id), got {mask.shape[0]}",
        )
    if mask.size and not np.all((mask == 0) | (mask == 1)):
        bad = int(np.argmax((mask != 0) & (mask != 1)))
        raise VerlRowError(index, "response_mask", f"expected 0 or 1 at [{bad}], got {mask[bad]}")
    logprobs = row.get("response_logprobs")
    if logprobs is None:
        raise VerlRowError(
            index,
            "response_logprobs",
            "expected the engine's behavior log-probabilities, got none (Dew trains on them)",
        )
    values = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    if values.shape[0] != response.size:
        raise VerlRowError(
            index,
            "response_logprobs",
            f"expected {response.size} values (one per response id), got {values.shape[0]}",
        )
    sampled = mask.astype(bool)
    if not np.all(np.isfinite(values[sampled])):
        bad = int(np.flatnonzero(sampled & ~np.isfinite(values))[0])
        raise VerlRowError(
            index, "response_logprobs", f"expected a finite value at [{bad}], got {values[bad]}"
        )
    return {"prompt": prompt, "response": response, "mask": sampled, "logprobs": values}


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of true flags, in order."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def reward(row: Mapping[str, Any], index: int) -> float:
    """The row's finite ``reward_score``."""
    value = row.get("reward_score")
    if value is None:
        raise VerlRowError(index, "reward_score", "expected the trajectory's reward, got none")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise VerlRowError(index, "reward_score", f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise VerlRowError(index, "reward_score", f"expected a finite number, got {value!r}")
    return number


def version(extras: Mapping[str, Any], index: int) -> int:
    """The policy version a native row was drawn with: ``extra_fields["min_global_steps"]``."""
    value = extras.get("min_global_steps")
    if value is None:
        raise VerlRowError(
            index,
            "extra_fields.min_global_steps",
            "expected the policy version the trajectory started on, got none",
        )
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not is_integer(value) or int(value) < 0:
        raise VerlRowError(
            index, "extra_fields.min_global_steps", f"expected an integer >= 0, got {value!r}"
        )
    return int(value)


def routed(row: Mapping[str, Any], index: int, length: int) -> np.ndarray | None:
    """``routed_experts`` as an array ``[n, layers, top_k]`` with ``n <= length``, or None."""
    value = row.get("routed_experts")
    if value is None:
        return None
    array = np.asarray(value)
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # a torch tensor
        array = np.asarray(value.numpy())
    if array.ndim != 3 or array.shape[0] > length or array.dtype.kind not in "iu":
        raise VerlRowError(
            index,
            "routed_experts",
            f"expected integer expert ids [n <= {length}, layers, top_k], got "
            f"{array.dtype} {array.shape}",
        )
    return array


def native_calls(
    parsed: dict[str, Any], routed: np.ndarray | None, version: int, index: int
) -> list[Call]:
    """One call per run of sampled ids, plus a last empty call when ids follow the last run."""
    ids = np.concatenate([parsed["prompt"], parsed["response"]])
    offset = parsed["prompt"].size
    logprobs = parsed["logprobs"]
    calls = []
    spans = [(offset + a, offset + b) for a, b in runs(parsed["mask"])]
    for start, stop in spans:
        record = None
        if routed is not None:
            if routed.shape[0] < stop:
                raise VerlRowError(
                    index,
                    "routed_experts",
                    f"covers {routed.shape[0]} ids, but the call sampled up to id {stop}",
                )
            record = routed[:stop]
        calls.append(
            Call(
                prompt_ids=ids[:start],
                sampled_ids=ids[start:stop],
                behavior_log_probs=logprobs[start - offset : stop - offset],
                finish_reason="stop",
                version=version,
                routed_experts=record,
            )
        )
    end = spans[-1][1] if spans else offset
    if end < ids.size or not spans:
        empty = None if routed is None else routed[:0]
        calls.append(
            Call(ids, [], [], finish_reason="abort", version=version, routed_experts=empty)
        )
    return calls


def dew_calls(
    parsed: dict[str, Any], routed: np.ndarray | None, record: Mapping[str, Any], index: int
) -> list[tuple[int, Call]]:
    """The calls Dew's ``record`` describes, each with its index in the session."""
    ids = np.concatenate([parsed["prompt"], parsed["response"]])
    offset = parsed["prompt"].size
    mask = np.concatenate([np.zeros(offset, bool), parsed["mask"]])
    logprobs = np.concatenate([np.zeros(offset), parsed["logprobs"]])
    out = []
    covered = 0
    for k, spec in enumerate(record.get("calls") or ()):
        where = f"extra_fields.dew.calls[{k}]"
        start, n = spec.get("start"), spec.get("sampled")
        if not (is_integer(start) and is_integer(n) and 0 < start and n >= 0):
            raise VerlRowError(
                index, where, f"expected integer start > 0 and sampled >= 0, got {spec!r}"
            )
        if start + n > ids.size or not mask[start : start + n].all():
            raise VerlRowError(
                index, where, f"ids [{start}, {start + n}) are not all sampled ids of the row"
            )
        covered += n
        record_routed = None
        if spec.get("routing") is not None:
            lo = 0 if spec["routing"] == "full" else start
            if routed is None or routed.shape[0] < start + n:
                raise VerlRowError(
                    index, "routed_experts", f"{where} recorded routing up to id {start + n}"
                )
            record_routed = routed[lo : start + n]
        try:
            call = Call(
                prompt_ids=ids[:start],
                sampled_ids=ids[start : start + n],
                behavior_log_probs=logprobs[start : start + n],
                finish_reason=spec.get("finish_reason", "stop"),
                version=spec.get("version", 0),
                raw_log_probs=spec.get("raw_log_probs"),
                routed_experts=record_routed,
                support=spec.get("support"),
            )
        except (TypeError, ValueError) as err:
            raise VerlRowError(index, where, str(err)) from None
        out.append((int(spec.get("index", k)), call))
    if covered != int(mask.sum()):
        raise VerlRowError(
            index,
            "extra_fields.dew.calls",
            f"the calls account for {covered} sampled ids, the mask has {int(mask.sum())}",
        )
    return out


__all__ = [
    "MEDIA_FIELDS",
    "TOKEN_FIELDS",
    "VerlRowError",
    "as_mapping",
    "dew_calls",
    "has_media",
    "native_calls",
    "reward",
    "routed",
    "runs",
    "tokens",
    "version",
]

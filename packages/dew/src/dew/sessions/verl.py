"""verl interop: sessions to verl ``AgentLoopOutput`` rows and back (host side, no verl import).

``to_verl(sessions)`` writes one row per strict chain of each session (a call joins the chain
when its prompt starts with every id of the chain so far, as in ``pack``): the first call's
prompt as ``prompt_ids``; every later id of the chain as ``response_ids``, with
``response_mask`` 1 on sampled ids; ``response_logprobs`` the engine's behavior
log-probabilities (0.0 off the mask); ``routed_experts`` ``[n, layers, top_k]`` when every
call of the chain recorded routing (where two calls recorded the same id, the later one wins,
as verl keeps its last generation's record); ``reward_score``; and ``extra_fields`` with
``min_global_steps``/``max_global_steps`` (the smallest and largest call version) and
``dew``, Dew's own record of the session (identity, status, reward, components, detail, and
per call its place, finish reason, version, routing form, support and raw log-probabilities).

``from_verl(rows, samples=1, media=False)`` reads rows back as :class:`VerlTrajectory` items.
With a ``dew`` record the session comes back exactly as written, its chains joined again. A
native verl row becomes one COMPLETED session: each run of mask-1 ids is one call whose prompt
is every id before it, its version the row's ``min_global_steps`` and its finish reason
``"stop"`` (verl does not record one); ids after the last run (an observation the loop
appended before it stopped) come back as a final call that sampled nothing
(``finish_reason="abort"``), so pack lays the row out id for id as verl does. Row ``i`` is
task ``i // samples``, sample ``i % samples``, verl's order for ``rollout.n = samples``.

verl's own ``extra_fields`` come back in ``VerlTrajectory.extras`` and every other row field
(``num_turns``, ``metrics``, media) in ``VerlTrajectory.fields``; ``to_verl`` of a trajectory
writes them back unchanged, and a native row's own ``min_global_steps``/``max_global_steps``
are kept. Refused, each with a :class:`VerlRowError` naming row and field: rows carrying media
(unless ``media=True``, for a round trip only: Dew's text trainer would score placeholder ids
without the pixels), rows without ``response_logprobs``, without a version or without a
reward (a row Dew wrote for a session that had no reward, an infrastructure failure say,
keeps ``reward_score=None`` and reads back). Row layout: verl 0.9.1 ``verl/experimental/agent_loop/agent_loop.py``
(``AgentLoopOutput``) and ``tool_agent_loop.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dew.checks import is_integer
from dew.sessions import verl_rows as rows_
from dew.sessions.chains import Chain, chains_of
from dew.sessions.records import Call, Session, Status
from dew.sessions.verl_rows import VerlRowError

DEW_FORMAT = 1
METRICS = {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": -1}


@dataclass(frozen=True, eq=False)
class VerlTrajectory:
    """One session read from verl rows, with what Dew keeps to write the rows back unchanged.

    Attributes:
      session: the session (its calls rebuilt from the rows' ids, masks and log-probs).
      extras: per row (chain order), verl's ``extra_fields`` without Dew's ``dew`` record.
      fields: per row, the row's other fields Dew does not model (``num_turns``, ``metrics``,
        ``multi_modal_data`` ...), written back as they came.
      prompt_lengths: per row, the length of its ``prompt_ids``.
      dew: whether the rows carried Dew's record (``to_verl`` writes it again only then).
    """

    session: Session
    extras: tuple[dict[str, Any], ...]
    fields: tuple[dict[str, Any], ...]
    prompt_lengths: tuple[int, ...]
    dew: bool


# ---------------------------------------------------------------- writing


def _routing(call: Call) -> str | None:
    if call.routed_experts is None:
        return None
    return (
        "full"
        if call.routed_experts.shape[0] == call.prompt_ids.size + call.sampled_ids.size
        else "sampled"
    )


def _routed_chain(calls: Sequence[Call], index: int) -> np.ndarray | None:
    """The chain's ``[n, layers, top_k]`` routing (later calls win), or None unless all have it."""
    if not calls or any(c.routed_experts is None for c in calls):
        return None
    inner, dtype = calls[0].routed_experts.shape[1:], calls[0].routed_experts.dtype
    spans = []
    for call in calls:
        record = call.routed_experts
        if record.shape[1:] != inner or record.dtype != dtype:
            raise ValueError(
                f"sessions[{index}]: routed_experts of one chain must share [layers, top_k] and "
                f"dtype; got {inner}/{dtype} and {record.shape[1:]}/{record.dtype}"
            )
        start = 0 if _routing(call) == "full" else call.prompt_ids.size
        spans.append((start, record))
    # an empty record (a call that sampled nothing) covers no id, wherever it would start
    length = max((start + r.shape[0] for start, r in spans if r.shape[0]), default=0)
    out = np.zeros((length, *inner), dtype)
    for start, record in spans:
        out[start : start + record.shape[0]] = record
    return out


def _call_record(call: Call, position: int) -> dict[str, Any]:
    return {
        "index": position,
        "start": int(call.prompt_ids.size),
        "sampled": int(call.sampled_ids.size),
        "finish_reason": call.finish_reason,
        "version": call.version,
        "routing": _routing(call),
        "support": None if call.support is None else [s.tolist() for s in call.support],
        "raw_log_probs": None if call.raw_log_probs is None else call.raw_log_probs.tolist(),
    }


def _session_rows(item: Session | VerlTrajectory, serial: int) -> list[dict[str, Any]]:
    """The verl rows of one session or trajectory, one per strict chain."""
    trajectory = item if isinstance(item, VerlTrajectory) else None
    session = trajectory.session if trajectory is not None else item
    if not isinstance(session, Session):
        raise TypeError(f"sessions[{serial}]: expected a Session or VerlTrajectory, got {item!r}")
    if not session.calls:
        raise ValueError(f"sessions[{serial}].calls: a session without calls has no verl row")
    chains = chains_of(session, serial)
    if trajectory is not None and len(trajectory.extras) != len(chains):
        raise ValueError(
            f"sessions[{serial}]: the trajectory kept {len(trajectory.extras)} rows of verl "
            f"fields, but its calls form {len(chains)} chains"
        )
    out = []
    first_call = 0
    for j, chain in enumerate(chains):
        calls = session.calls[first_call : first_call + chain.n_calls]
        positions = range(first_call, first_call + chain.n_calls)
        first_call += chain.n_calls
        extras = dict(trajectory.extras[j]) if trajectory is not None else {}
        for key, value in _global_steps(calls):
            if extras.get(key) is None:
                extras[key] = value
        if trajectory is None or trajectory.dew:
            extras["dew"] = _dew_record(session, serial, j, len(chains), calls, positions)
        out.append(_chain_row(session, trajectory, serial, j, chain, calls, extras))
    return out


def _global_steps(calls: Sequence[Call]) -> tuple[tuple[str, int], ...]:
    """verl's ``min_global_steps`` and ``max_global_steps`` of a chain: its call versions."""
    versions = [c.version for c in calls]
    return (("min_global_steps", min(versions)), ("max_global_steps", max(versions)))


def _dew_record(
    session: Session,
    serial: int,
    chain: int,
    chains: int,
    calls: Sequence[Call],
    positions: Sequence[int],
) -> dict[str, Any]:
    """Dew's own record of a session in one chain's ``extra_fields["dew"]``."""
    return {
        "format": DEW_FORMAT,
        "session": serial,
        "chain": chain,
        "chains": chains,
        "task": session.task,
        "group": int(session.group),
        "sample": int(session.sample),
        "attempt": int(session.attempt),
        "status": session.status.value,
        "reward": session.reward,
        "components": dict(session.components),
        "detail": session.detail,
        "calls": [_call_record(c, p) for c, p in zip(calls, positions)],
    }


def _chain_row(
    session: Session,
    trajectory: VerlTrajectory | None,
    serial: int,
    j: int,
    chain: Chain,
    calls: Sequence[Call],
    extras: dict[str, Any],
) -> dict[str, Any]:
    """The verl row of chain ``j``: its prompt, response, mask, log-probs and fields."""
    split = trajectory.prompt_lengths[j] if trajectory is not None else calls[0].prompt_ids.size
    ids = np.asarray(chain.ids, np.int64)
    mask = np.asarray(chain.sampled, np.int64)
    response_mask = mask[split:]
    row: dict[str, Any] = {
        "prompt_ids": ids[:split].tolist(),
        "response_ids": ids[split:].tolist(),
        "response_mask": response_mask.tolist(),
        "response_logprobs": [float(x) for x in chain.behavior[split:]],
    }
    row["routed_experts"] = _routed_chain(calls, serial)
    row["reward_score"] = session.reward
    if trajectory is not None:
        row.update(trajectory.fields[j])
    else:
        observations = len(rows_.runs(response_mask == 0))
        row["num_turns"] = chain.n_calls + observations + 1
        row["metrics"] = dict(METRICS)
    row["extra_fields"] = extras
    return row


def to_verl(sessions: Sequence[Session | VerlTrajectory]) -> list[dict[str, Any]]:
    """verl ``AgentLoopOutput`` rows (as dicts), one per strict chain, sessions in order.

    ``AgentLoopOutput(**row)`` accepts each row. A ``VerlTrajectory`` from :func:`from_verl`
    writes its rows back with their verl fields unchanged. A session without calls is refused.
    """
    out: list[dict[str, Any]] = []
    for serial, item in enumerate(sessions):
        out.extend(_session_rows(item, serial))
    return out


# ---------------------------------------------------------------- reading


def _read_row(row: Any, index: int, media: bool) -> dict[str, Any]:
    data = rows_.as_mapping(row, index)
    carried = rows_.has_media(data)
    if carried and not media:
        raise VerlRowError(
            index,
            carried[0],
            "the row carries media, which Dew's text trainer would score as bare placeholder "
            "ids; pass media=True to import it for a round trip only",
        )
    parsed = rows_.tokens(data, index)
    total = parsed["prompt"].size + parsed["response"].size
    extras = data.get("extra_fields") or {}
    if not isinstance(extras, Mapping):
        raise VerlRowError(index, "extra_fields", f"expected a mapping, got {extras!r}")
    extras = dict(extras)
    record = extras.pop("dew", None)
    return {
        "data": data,
        "parsed": parsed,
        "routed": rows_.routed(data, index, total),
        "extras": extras,
        "record": record,
        "fields": {k: v for k, v in data.items() if k not in rows_.TOKEN_FIELDS},
    }


def _native(item: dict[str, Any], index: int, samples: int) -> VerlTrajectory:
    version = rows_.version(item["extras"], index)
    reward = rows_.reward(item["data"], index)
    calls = rows_.native_calls(item["parsed"], item["routed"], version, index)
    session = Session(task=index // samples, sample=index % samples, calls=calls, reward=reward)
    return VerlTrajectory(
        session, (item["extras"],), (item["fields"],), (item["parsed"]["prompt"].size,), False
    )


def _joined(items: list[tuple[int, dict[str, Any]]]) -> VerlTrajectory:
    items = sorted(items, key=lambda pair: pair[1]["record"].get("chain", 0))
    index, first = items[0]
    record = first["record"]
    count = record.get("chains")
    chain_numbers = [it["record"].get("chain") for _, it in items]
    if chain_numbers != list(range(len(items))) or count != len(items):
        raise VerlRowError(
            index,
            "extra_fields.dew.chain",
            f"expected chains 0..{count - 1 if is_integer(count) else '?'} of one session, "
            f"got {chain_numbers}",
        )
    numbered: list[tuple[int, Call]] = []
    for row_index, item in items:
        numbered.extend(rows_.dew_calls(item["parsed"], item["routed"], item["record"], row_index))
    numbered.sort(key=lambda pair: pair[0])
    if [n for n, _ in numbered] != list(range(len(numbered))):
        raise VerlRowError(
            index, "extra_fields.dew.calls", f"call indices {[n for n, _ in numbered]} have gaps"
        )
    reward = first["data"].get("reward_score")
    if reward is None and record.get("reward") is not None:
        reward = rows_.reward(first["data"], index)  # raises: the session had a reward
    session = Session(
        task=record.get("task"),
        group=record.get("group", 0),
        sample=record.get("sample", 0),
        attempt=record.get("attempt", 0),
        calls=[c for _, c in numbered],
        status=Status(record.get("status", Status.COMPLETED.value)),
        reward=reward,
        components=record.get("components") or {},
        detail=record.get("detail", ""),
    )
    return VerlTrajectory(
        session,
        tuple(it["extras"] for _, it in items),
        tuple(it["fields"] for _, it in items),
        tuple(it["parsed"]["prompt"].size for _, it in items),
        True,
    )


def from_verl(rows: Sequence[Any], samples: int = 1, media: bool = False) -> list[VerlTrajectory]:
    """Read verl ``AgentLoopOutput`` rows (mappings or objects) back as trajectories.

    Args:
      rows: the rows, in verl's order.
      samples: verl's ``rollout.n``: native row ``i`` is task ``i // samples``, sample
        ``i % samples``.
      media: import rows that carry media (for a round trip only).

    Returns one :class:`VerlTrajectory` per session, in the order of each session's first row.
    """
    if not is_integer(samples) or samples < 1:
        raise ValueError(
            f"samples: expected a positive integer (verl's rollout.n), got {samples!r}"
        )
    order: list[Any] = []
    native: dict[Any, VerlTrajectory] = {}
    joined: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for index, row in enumerate(rows):
        item = _read_row(row, index, media)
        record = item["record"]
        if record is None:
            native[("row", index)] = _native(item, index, int(samples))
            order.append(("row", index))
            continue
        if not isinstance(record, Mapping) or record.get("format") != DEW_FORMAT:
            raise VerlRowError(
                index,
                "extra_fields.dew",
                f"expected Dew's record (format {DEW_FORMAT}), got {record!r}",
            )
        key = ("dew", repr((record.get("session"), record.get("task"), record.get("group"),
                            record.get("sample"), record.get("attempt"))))  # fmt: skip
        if key not in joined:
            joined[key] = []
            order.append(key)
        joined[key].append((index, item))
    return [native[key] if key[0] == "row" else _joined(joined[key]) for key in order]


__all__ = ["VerlRowError", "VerlTrajectory", "from_verl", "to_verl"]

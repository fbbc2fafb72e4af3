"""The packer that turns sessions into GRPO rows (host side).

``pack`` builds one training batch out of sessions:

1. Which sessions train (``dew.sessions.chains``): COMPLETED and AGENT_ERROR
   always do; INFRA_ERROR and CANCELLED never do; ``truncation`` decides TRUNCATED.
2. Advantages, group-relative over ``(task, group)`` among the training sessions, ported from
   verl 0.9.1 ``compute_grpo_outcome_advantage`` (``"group"``: unbiased std + 1e-6;
   ``"mean"``: centred only, verl's ``norm_adv_by_std_in_grpo=False``, Dr.GRPO) and
   ``compute_rloo_outcome_advantage`` (``"rloo"``). As in verl a group of one has baseline 0
   (and deviation 1), so its advantage is its reward.
3. Chains (``dew.sessions.chains``): a call continues the previous call's chain
   only when its prompt starts with every id of that chain, sampled ids included.
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

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dew.checks import is_integer
from dew.sessions.advantages import check_estimator, group_advantages
from dew.sessions.chains import (
    TRUNCATIONS,
    Chain,
    training_chains,
    training_reward,
    trains,
)
from dew.sessions.records import Call, Session, check_choice


def _check_width(width: int) -> int:
    """Check a row width (an integer >= 2) and return it as int."""
    if not is_integer(width) or width < 2:
        raise ValueError(f"width: expected an integer >= 2, got {width!r}")
    return int(width)


def chain_lengths(sessions: Sequence[Session], width: int, truncation: str = "mask") -> list[int]:
    """Length of every chain ``pack`` would place, in session order; raises on a chain > width."""
    width = _check_width(width)
    check_choice(truncation, TRUNCATIONS, "truncation")
    return [len(c.ids) for c in training_chains(sessions, width, truncation, None)]


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
      estimator: ``"group"``, ``"mean"``, ``"rloo"`` or another name registered with
        ``dew.rl.register_advantage_estimator``.
      truncation: ``"mask"``, ``"score"`` or ``"zero"`` for TRUNCATED sessions.
      support_capacity: width of ``support_ids``; required when a call recorded a support.
      eos_ids: when given, every packed call is checked: no id after EOS, and a ``"stop"``
        finish reason exactly when the last sampled id is EOS.
    """
    width = _check_width(width)
    check_estimator(estimator)
    check_choice(truncation, TRUNCATIONS, "truncation")
    if rows is not None and (not is_integer(rows) or rows < 1):
        raise ValueError(f"rows: expected None or a positive integer, got {rows!r}")
    if isinstance(eos_ids, int | np.integer):
        eos_ids = (int(eos_ids),)
    sessions = list(sessions)
    chains = training_chains(sessions, width, truncation, eos_ids)
    trained = [i for i, s in enumerate(sessions) if trains(s, truncation)]
    advantage_of = _advantages(sessions, trained, truncation, estimator)
    placement, needed = _first_fit([len(c.ids) for c in chains], width)
    rows = _row_count(needed, rows, width)
    packed_calls = [c for i in trained for c in sessions[i].calls]
    batch = _empty_batch((rows, width), packed_calls, support_capacity)
    sampled_count = _sampled_counts(chains)
    segment_of = _segment_ids(placement, rows)
    support_fill = [0] * rows
    for i, (chain, (row, offset)) in enumerate(zip(chains, placement)):
        advantage, count = advantage_of[chain.session], sampled_count[chain.session]
        _place_chain(batch, chain, row, offset, segment_of[i], advantage, count)
        _place_support(batch, chain, row, offset, support_fill, support_capacity)
    if "support_ids" in batch:
        _check_every_call_has_support(packed_calls)
    return batch


def _advantages(
    sessions: Sequence[Session], trained: Sequence[int], truncation: str, estimator: str
) -> dict[int, float]:
    """The group-relative advantage of each training session, by its index in ``sessions``."""
    rewards = [training_reward(sessions[i], truncation, i) for i in trained]
    keys = [(sessions[i].task, sessions[i].group) for i in trained]
    return dict(zip(trained, group_advantages(rewards, keys, estimator).tolist()))


def _row_count(needed: int, rows: int | np.integer[Any] | None, width: int) -> int:
    """The batch's row count: the rows asked for, or those the chains need (at least one)."""
    if rows is None:
        rows = max(needed, 1)
    elif needed > rows:
        raise ValueError(f"rows: the chains need {needed} rows of width {width}, got rows={rows}")
    return int(rows)


def _empty_batch(
    shape: tuple[int, int], packed_calls: Sequence[Call], support_capacity: int | None
) -> dict[str, np.ndarray]:
    """Every column of the batch, filled with its padding value, before any chain is placed."""
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
    with_raw = [c.raw_log_probs is not None for c in packed_calls]
    if any(with_raw) and not all(with_raw):
        raise ValueError(
            "Call.raw_log_probs: either every packed call carries raw log-probabilities or none "
            f"does; {sum(with_raw)} of {len(with_raw)} do"
        )
    if packed_calls and all(with_raw):
        batch["old_log_probs"] = np.zeros(shape, np.float32)
    batch.update(_routed_columns(shape, packed_calls))
    batch.update(_support_columns(shape[0], packed_calls, support_capacity))
    return batch


def _routed_columns(shape: tuple[int, int], packed_calls: Sequence[Call]) -> dict[str, np.ndarray]:
    """``routed_experts`` and ``routed`` when any call recorded routing, checked alike."""
    records = [c.routed_experts for c in packed_calls if c.routed_experts is not None]
    if not records:
        return {}
    inner, dtype = records[0].shape[1:], records[0].dtype
    for record in records:
        if record.shape[1:] != inner or record.dtype != dtype:
            raise ValueError(
                "Call.routed_experts: every record must share [layers, top_k] and dtype; got "
                f"{inner}/{dtype} and {record.shape[1:]}/{record.dtype}"
            )
    return {"routed_experts": np.zeros(shape + inner, dtype), "routed": np.zeros(shape, np.bool_)}


def _support_columns(
    rows: int, packed_calls: Sequence[Call], support_capacity: int | None
) -> dict[str, np.ndarray]:
    """``support_ids`` and ``support_columns`` when any call recorded its sampling support."""
    if not any(c.support is not None for c in packed_calls):
        return {}
    if support_capacity is None or isinstance(support_capacity, bool) or support_capacity < 1:
        raise ValueError(
            "support_capacity: calls recorded sampling supports, so a positive capacity is "
            f"required, got {support_capacity!r}"
        )
    return {
        "support_ids": np.full((rows, int(support_capacity)), -1, np.int32),
        "support_columns": np.full((rows, int(support_capacity)), -1, np.int32),
    }


def _sampled_counts(chains: Sequence[Chain]) -> dict[int, int]:
    """The number of sampled ids of each session over all its chains."""
    sampled_count: dict[int, int] = {}
    for chain in chains:
        sampled_count[chain.session] = sampled_count.get(chain.session, 0) + sum(chain.sampled)
    return sampled_count


def _segment_ids(placement: Sequence[tuple[int, int]], rows: int) -> list[int]:
    """Each chain's segment id: 1, 2, ... from the left of its row."""
    segment_of = [0] * len(placement)
    counters = [0] * rows
    for i in sorted(range(len(placement)), key=lambda i: placement[i]):
        counters[placement[i][0]] += 1
        segment_of[i] = counters[placement[i][0]]
    return segment_of


def _place_chain(
    batch: dict[str, np.ndarray],
    chain: Chain,
    row: int,
    offset: int,
    segment: int,
    advantage: float,
    count: int,
) -> None:
    """Write one chain's ids and per-id columns into ``row`` from column ``offset``."""
    n = len(chain.ids)
    cols = slice(offset, offset + n)
    sampled = np.asarray(chain.sampled, dtype=bool)
    batch["input_ids"][row, cols] = chain.ids
    batch["text_segment_ids"][row, cols] = segment
    batch["text_positions"][row, cols] = np.arange(n)
    batch["response_mask"][row, cols] = sampled
    batch["behavior_log_probs"][row, cols] = chain.behavior
    if "old_log_probs" in batch:
        batch["old_log_probs"][row, cols] = chain.raw
    batch["versions"][row, cols] = chain.versions
    batch["session_index"][row, cols] = np.where(sampled, chain.session, -1)
    batch["call_index"][row, cols] = chain.calls
    batch["advantages"][row, cols] = advantage
    if count:
        batch["session_weights"][row, cols] = np.where(sampled, 1.0 / count, 0.0)
    for position, record in chain.routed.items():
        batch["routed_experts"][row, offset + position] = record
        batch["routed"][row, offset + position] = True


def _place_support(
    batch: dict[str, np.ndarray],
    chain: Chain,
    row: int,
    offset: int,
    support_fill: list[int],
    support_capacity: int | None,
) -> None:
    """Append a chain's kept ids to its row's support, after those already there."""
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


def _check_every_call_has_support(packed_calls: Sequence[Call]) -> None:
    """Raise unless every packed call that sampled ids recorded its sampling support."""
    missing = [
        i for i, c in enumerate(packed_calls) if c.support is None and c.sampled_ids.size > 0
    ]
    if missing:
        raise ValueError(
            "Call.support: either every packed call records its sampling support or none "
            f"does; {len(missing)} packed calls have none"
        )


__all__ = ["chain_lengths", "pack", "rows_needed"]

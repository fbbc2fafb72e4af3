"""Chains: which sessions train and how a session's calls join into chains (host side).

A session trains when its status says so: COMPLETED and AGENT_ERROR always train on their
reward; INFRA_ERROR and CANCELLED never do (no rows, no part in any baseline). ``truncation``
decides TRUNCATED: ``"mask"`` drops them, ``"score"`` trains them on their reward, ``"zero"``
on reward 0.

Call ``k + 1`` joins call ``k``'s chain only when its prompt starts with every id of the chain
so far, sampled ids included; otherwise it opens a new chain. A prompt that merely shares the
earlier *prompt* never merges: that would splice sampled ids into a context the model did not
read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dew.sessions.records import Call, Session, Status

TRUNCATIONS = ("mask", "score", "zero")


def trains(session: Session, truncation: str) -> bool:
    """Whether ``session`` takes part in training under ``truncation``."""
    if session.status in (Status.COMPLETED, Status.AGENT_ERROR):
        return True
    if session.status is Status.TRUNCATED:
        return truncation != "mask"
    return False


def training_reward(session: Session, truncation: str, index: int) -> float:
    """The reward ``session`` (at ``sessions[index]``) trains on; raises when it has none."""
    if session.status is Status.TRUNCATED and truncation == "zero":
        return 0.0
    if session.reward is None:
        raise ValueError(
            f"sessions[{index}].reward: a {session.status.name} session trains, so it needs a "
            "reward, got None"
        )
    return float(session.reward)


@dataclass
class Chain:
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


def chains_of(session: Session, index: int) -> list[Chain]:
    """The chains of ``session`` (at ``sessions[index]``), in call order."""
    chains: list[Chain] = []
    current: Chain | None = None
    for call_index, call in enumerate(session.calls):
        so_far = current.ids if current is not None else None
        extends = (
            so_far is not None
            and call.prompt_ids.size >= len(so_far)
            and np.array_equal(call.prompt_ids[: len(so_far)], np.asarray(so_far, dtype=np.int64))
        )
        if not extends:
            current = Chain(session=index)
            chains.append(current)
        assert current is not None
        current.extend(call, call_index)
    return chains


def training_chains(
    sessions: Sequence[Session], width: int, truncation: str, eos_ids: Iterable[int] | None
) -> list[Chain]:
    """Every chain of the training sessions; checks EOS and that each chain fits ``width``."""
    eos = tuple(eos_ids) if eos_ids is not None else ()
    chains: list[Chain] = []
    for index, session in enumerate(sessions):
        if not isinstance(session, Session):
            raise TypeError(f"sessions[{index}]: expected a Session, got {type(session)}")
        if not trains(session, truncation):
            continue
        for call_index, call in enumerate(session.calls):
            try:
                call.check_eos(eos)
            except ValueError as err:
                raise ValueError(f"sessions[{index}].calls[{call_index}]: {err}") from None
        for chain in chains_of(session, index):
            if len(chain.ids) > width:
                raise ValueError(
                    f"sessions[{index}]: a chain of {len(chain.ids)} ids does not fit a row of "
                    f"width {width}"
                )
            chains.append(chain)
    return chains


__all__ = ["TRUNCATIONS", "Chain", "chains_of", "training_chains", "training_reward", "trains"]

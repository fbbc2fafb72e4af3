"""What both sources share: resolving a session future once, the call a draw makes, and
per-turn seeds (host side)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import numpy as np

from dew.rollout.draw import Draw
from dew.sessions.records import Call, Session, Status, Task


def resolve(future: Future[Session], session: Session) -> bool:
    """Set ``future``'s result unless it already has one (a cancel may have won the race)."""
    try:
        future.set_result(session)
    except InvalidStateError:
        return False
    return True


def ended(task: Task, status: Status, detail: str, calls: tuple[Call, ...] = ()) -> Session:
    """A session that carries no reward: INFRA_ERROR or CANCELLED."""
    return Session(task=task.id, calls=calls, status=status, detail=detail)


def call_of(draw: Draw) -> Call:
    """The ``Call`` a draw made: its prompt, sampled ids, both likelihoods and its version
    (the oldest weights that produced any of its ids)."""
    support = None
    if draw.support is not None:
        support = [kept[kept >= 0] for kept in np.asarray(draw.support)]
    return Call(
        prompt_ids=draw.prompt_ids,
        sampled_ids=draw.ids,
        behavior_log_probs=draw.behavior_log_probs,
        raw_log_probs=draw.raw_log_probs,
        finish_reason="stop" if draw.eos else "length",
        version=int(draw.version),
        support=support,
        routed_experts=draw.routed_experts,
    )


def turn_seed(seed: int, turn: int) -> int:
    """The engine seed of a session's ``turn``: a uint32 mixed from the session seed."""
    return int(np.random.SeedSequence([int(seed), int(turn)]).generate_state(1)[0])


def check_callable(value: Any, name: str, shape: str) -> Callable[..., Any]:
    if not callable(value):
        raise TypeError(f"{name}: expected a callable {shape}, got {type(value).__name__}")
    return value


def check_positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected a nonnegative integer, got {seed!r}")
    return int(seed)


def cancel_draw(server: Any, draw: Future[Draw] | None) -> None:
    """Ask ``server`` to stop ``draw`` when it can (``NativeRolloutServer.cancel``)."""
    if draw is None or draw.done():
        return
    cancel = getattr(server, "cancel", None)
    if callable(cancel):
        cancel(draw)

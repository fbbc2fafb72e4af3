"""The checks ``RolloutScheduler`` runs on its arguments before it starts (host side).

``check_schedule`` relates ``ahead``, ``sync_every`` and ``max_lag``: a batch submitted
``ahead`` calls early under weights pushed every ``sync_every`` updates is up to
``ahead + sync_every - 1`` updates old when it trains, so ``max_lag`` must allow that. An
``AdaptiveAhead`` (``staleness``) in ``ahead``'s place may choose any ``ahead`` in
``[0, max_lag - sync_every + 1]``; its ``start`` must lie there too.
"""

from __future__ import annotations

from typing import Any

import jax

from dew.checks import is_int
from dew.rollout.scheduler.staleness import AdaptiveAhead


def count(value: Any, name: str, minimum: int) -> int:
    """``value`` as an int, or ``ValueError`` naming ``name`` unless an integer >= minimum."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_protocols(source: Any, weights: Any, tasks: Any) -> None:
    """Raise ``TypeError`` unless each collaborator has the methods the scheduler calls (the
    objective is its packer's to check)."""
    for name in ("submit", "cancel"):
        if not callable(getattr(source, name, None)):
            raise TypeError(f"source: expected a SessionSource, it has no {name}()")
    if not callable(getattr(weights, "load", None)) or not hasattr(weights, "version"):
        raise TypeError("weights: expected load(variables, version) and a version")
    if not callable(tasks):
        raise TypeError(f"tasks: expected a function batch -> [Task], got {tasks!r}")


def check_schedule(
    objective: Any, ahead: Any, sync_every: Any, max_lag: Any
) -> tuple[int, int, int, AdaptiveAhead | None]:
    """``(ahead, sync_every, max_lag, adaptive)`` checked against each other and the objective.

    With an ``AdaptiveAhead``, the returned ``ahead`` is the most it may choose,
    ``max_lag - sync_every + 1`` (the controller is bound to it); otherwise ``adaptive`` is
    None and ``ahead`` is the fixed one.
    """
    adaptive = ahead if isinstance(ahead, AdaptiveAhead) else None
    sync_every = count(sync_every, "sync_every", 1)
    max_lag = count(max_lag, "max_lag", 0)
    if adaptive is not None:
        top = max_lag - sync_every + 1
        if top < 0 or adaptive.ahead > top:
            raise ValueError(
                f"ahead: an AdaptiveAhead chooses within [0, max_lag - sync_every + 1 = {top}], "
                f"got start {adaptive.ahead} (max_lag={max_lag}, sync_every={sync_every})"
            )
        adaptive.bind(top)
        ahead = top
    ahead = count(ahead, "ahead", 0)
    if max_lag < ahead + sync_every - 1:
        raise ValueError(
            f"max_lag: a first submission may be ahead + sync_every - 1 = "
            f"{ahead + sync_every - 1} updates old when it trains, got max_lag={max_lag}"
        )
    if max_lag > 0 and getattr(objective, "behavior_importance", None) is None:
        raise ValueError(
            f"objective.behavior_importance: max_lag={max_lag} lets rollouts train on "
            "older weights, which needs a behavior correction: GRPOObjective("
            "behavior_importance=c) (a TIS cap) or (lo, hi) (an IcePop band)"
        )
    return ahead, sync_every, max_lag, adaptive


def check_single_process(**options: Any) -> None:
    """On a multi-process trainer, ``ValueError`` naming the first option given (not None)."""
    if jax.process_count() == 1:
        return
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"{name}: supported on a single-process trainer only")


__all__ = ["check_protocols", "check_schedule", "check_single_process", "count"]

"""Variable collections a run never changes, kept out of its checkpoints.

An objective may name `frozen_collections` (a tuple of collection names of its
variables, e.g. the frozen base of `dew.objectives.lora.LoraObjective`). The
Trainer never updates them (it differentiates and optimizes `params` only);
checkpoints leave them out and a resumed state takes them from the objective's
`init`, as a fresh run would. So that a run does not resume against other
frozen weights, the objective's `frozen_identity(variables)` (a JSON-ready
mapping, e.g. a path and a hash) is written into the checkpoint's extra fields
under `"frozen"` and compared on resume; a difference is refused, naming both.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from dew.trainer.state import TrainState


def frozen_names(objective: Any) -> tuple[str, ...]:
    """The objective's `frozen_collections` (none by default); `params` may not be one."""
    names = tuple(getattr(objective, "frozen_collections", ()))
    if "params" in names:
        raise ValueError("objective.frozen_collections: expected names other than 'params'")
    return names


def without_frozen(state: TrainState, names: tuple[str, ...]) -> TrainState:
    """`state` (or its tree of shardings) with the frozen collections left out of `params`."""
    if not names:
        return state
    kept = {k: v for k, v in state.params.items() if k not in names}
    return dataclasses.replace(state, params=kept)


def with_frozen(state: TrainState, source: TrainState, names: tuple[str, ...]) -> TrainState:
    """`state` with the frozen collections of `source` put back into `params`."""
    if not names:
        return state
    back = {n: source.params[n] for n in names}
    return dataclasses.replace(state, params={**state.params, **back})


def identity(objective: Any, state: TrainState) -> dict[str, Any]:
    """`{"frozen": objective.frozen_identity(variables)}`, or `{}` without one."""
    describe = getattr(objective, "frozen_identity", None)
    if describe is None or not frozen_names(objective):
        return {}
    return {"frozen": describe(state.params)}


def check_identity(path: str, meta: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse a checkpoint whose recorded frozen identity is not this run's."""
    if not expected:
        return
    saved = meta.get("extra", {}).get("frozen")
    if saved != expected["frozen"]:
        raise ValueError(
            f"checkpoint {path}: trained against frozen weights {json.dumps(saved)}, this run "
            f"has {json.dumps(expected['frozen'])}; resume with the same base or start a new "
            "run directory"
        )


__all__ = ["check_identity", "frozen_names", "identity", "with_frozen", "without_frozen"]

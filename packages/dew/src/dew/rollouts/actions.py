"""The actions of a packed batch, in the order they were drawn.

An *action* is a sampled id that trains: a cell with ``response_mask > 0`` and
``session_index >= 0``. ``action_order`` lists them grouped by episode (session), then by call,
then by position inside the call's chain, which is the order GAE walks an episode
(``dew.rollouts.ppo``) and the per-episode rows the KL charge averages over
(``dew.rollouts.shaping``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: The packed columns ``action_order`` reads.
REQUIRED = ("response_mask", "session_index", "call_index", "text_positions")


def _column(batch: Mapping[str, Any], name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    if name not in batch:
        raise KeyError(f"batch[{name!r}]: missing; the actions of a packed batch need its {name}")
    value = np.asarray(batch[name])
    if value.ndim != 2 or (shape is not None and value.shape != shape):
        want = "[B, W]" if shape is None else f"{shape} aligned with response_mask"
        raise ValueError(f"batch[{name!r}]: expected {want}, got shape {value.shape}")
    return value


def action_order(batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every action cell of a packed batch, grouped by episode, in draw order.

    Returns ``(rows, cols, episodes)``, 1-D arrays of equal length: the packed cell of each
    action and its ``session_index``, sorted by episode, then ``call_index``, then position.
    An action is a cell with ``response_mask > 0`` and ``session_index >= 0``.
    """
    mask = _column(batch, "response_mask", None)
    shape = mask.shape
    session = _column(batch, "session_index", shape)
    call = _column(batch, "call_index", shape)
    position = _column(batch, "text_positions", shape)
    rows, cols = np.nonzero((mask > 0) & (session >= 0))
    order = np.lexsort((position[rows, cols], call[rows, cols], session[rows, cols]))
    rows, cols = rows[order], cols[order]
    return rows, cols, session[rows, cols].astype(np.int64)


__all__ = ["REQUIRED", "action_order"]

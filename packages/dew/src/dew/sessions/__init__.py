"""Sessions: engine calls, the sessions they make, and how sessions become training rows.

- ``records``: ``Call``, ``Session``, ``Status``, ``Task`` and their validation.
- ``source``: ``SessionSource``, the protocol of anything that turns a ``Task`` into a future
  ``Session`` (``submit(task, seed=)``, ``cancel(future)``).
- ``chains``: which sessions train and how a session's calls join into chains.
- ``advantages``: group-relative advantages of session rewards (``group_advantages``).
- ``packing``: ``pack`` (sessions -> one ``[rows, width]`` GRPO batch), ``rows_needed``,
  ``chain_lengths``.
- ``metrics``: ``session_metrics``, host diagnostics of one batch of sessions.
- ``verl``: ``to_verl``/``from_verl``, sessions to verl ``AgentLoopOutput`` rows and back
  (``verl_rows`` reads and checks one row).

The collectors that make sessions inside the trainer live in ``dew.rollouts``. Names resolve
lazily, so reading the records imports neither JAX nor the inference engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES: dict[str, str] = {
    "Call": "records",
    "Session": "records",
    "Status": "records",
    "Task": "records",
    "SessionSource": "source",
    "TRUNCATIONS": "chains",
    "ESTIMATORS": "advantages",
    "GROUP_EPSILON": "advantages",
    "group_advantages": "advantages",
    "chain_lengths": "packing",
    "pack": "packing",
    "rows_needed": "packing",
    "session_metrics": "metrics",
    "VerlRowError": "verl",
    "VerlTrajectory": "verl",
    "from_verl": "verl",
    "to_verl": "verl",
}


# Like dew.objectives.rl's: a module-level __getattr__ serves only its own package, so each
# lazy package keeps its own three lines over its own table.
def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.sessions' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dew.sessions.{module}"), name)


__all__ = sorted(_NAMES)

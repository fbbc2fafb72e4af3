"""Deprecated alias of the session records, packing and metrics in ``dew.objectives.rollouts``.

Kept for one release so existing imports keep working; import from ``dew.objectives.rollouts``
(or its modules ``records``, ``advantages``, ``packing``, ``metrics``) instead.
"""

from dew.objectives.rollouts.advantages import ESTIMATORS, GROUP_EPSILON, group_advantages
from dew.objectives.rollouts.chains import TRUNCATIONS
from dew.objectives.rollouts.metrics import session_metrics
from dew.objectives.rollouts.packing import chain_lengths, pack, rows_needed
from dew.objectives.rollouts.records import Call, Session, Status, Task

__all__ = [
    "Call",
    "ESTIMATORS",
    "GROUP_EPSILON",
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

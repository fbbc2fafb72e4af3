"""Deprecated alias of the session records, packing and metrics in ``dew.objectives.rollouts``.

Kept for one release so existing imports keep working; import from ``dew.objectives.rollouts``
(or its modules ``records``, ``source``, ``advantages``, ``packing``, ``metrics``) instead.
``SessionSource``, the protocol of a harness that turns a ``Task`` into a future ``Session``,
is found here too.
"""

from dew.objectives.rollouts.advantages import ESTIMATORS, GROUP_EPSILON, group_advantages
from dew.objectives.rollouts.chains import TRUNCATIONS
from dew.objectives.rollouts.metrics import session_metrics
from dew.objectives.rollouts.packing import chain_lengths, pack, rows_needed
from dew.objectives.rollouts.records import Call, Session, Status, Task
from dew.objectives.rollouts.source import SessionSource

__all__ = [
    "Call",
    "ESTIMATORS",
    "GROUP_EPSILON",
    "Session",
    "SessionSource",
    "Status",
    "TRUNCATIONS",
    "Task",
    "chain_lengths",
    "group_advantages",
    "pack",
    "rows_needed",
    "session_metrics",
]

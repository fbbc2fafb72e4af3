"""The session records and helpers, reachable as ``dew.objectives.rl.sessions``.

The code lives in ``dew.sessions`` (its modules ``records``, ``source``, ``chains``,
``advantages``, ``packing``, ``metrics``); this module names the same objects under the path
the RL objectives are imported from. ``SessionSource``, the protocol of a harness that turns a
``Task`` into a future ``Session``, is found here too.
"""

from dew.sessions.advantages import ESTIMATORS, GROUP_EPSILON, group_advantages
from dew.sessions.chains import TRUNCATIONS
from dew.sessions.metrics import session_metrics
from dew.sessions.packing import chain_lengths, pack, rows_needed
from dew.sessions.records import Call, Session, Status, Task
from dew.sessions.source import SessionSource

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

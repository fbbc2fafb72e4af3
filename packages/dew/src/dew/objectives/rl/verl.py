"""verl interop, reachable as ``dew.objectives.rl.verl``: ``to_verl`` and ``from_verl``.

The code lives in ``dew.sessions.verl`` beside the session records it converts;
see that module for the row layout.
"""

from dew.sessions.verl import VerlRowError, VerlTrajectory, from_verl, to_verl

__all__ = ["VerlRowError", "VerlTrajectory", "from_verl", "to_verl"]

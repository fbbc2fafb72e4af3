"""``dew.objectives.rl.verl`` is the ``dew.sessions.verl`` module under a second name.

The verl interop (``to_verl``, ``from_verl``, ``VerlTrajectory``, ``VerlRowError``) is
imported beside the RL objectives as ``dew.objectives.rl.verl``; the code lives with the
session records it converts, in ``dew.sessions.verl``. Importing this module replaces it, in
``sys.modules``, by that module, so both names reach one module object.
"""

import sys

import dew.sessions.verl

sys.modules[__name__] = dew.sessions.verl

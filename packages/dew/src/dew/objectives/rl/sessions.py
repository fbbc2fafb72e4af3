"""``dew.objectives.rl.sessions`` is the ``dew.sessions`` package under a second name.

The user guides import the session records (``Call``, ``Session``, ``Status``, ``Task``,
``SessionSource``) and their helpers (``pack``, ``group_advantages``, ...) from
``dew.objectives.rl.sessions``, beside the objectives that train on them; the code lives in
its own room, ``dew.sessions``. Importing this module replaces it, in ``sys.modules``, by
that package, so both names reach one module object and each session name has one home:
``dew.objectives.rl.sessions.pack is dew.sessions.pack``, and ``__name__`` reads
``dew.sessions``.
"""

import sys

import dew.sessions

sys.modules[__name__] = dew.sessions

"""The ``code_reward`` that ``dew quickstart --code`` finds through an entry point.

``dew`` may not import ``dew.sandbox``, so this distribution registers the factory below in
the ``dew.quickstart`` entry-point group (see ``pyproject.toml``); the quickstart looks it up
with ``importlib.metadata`` and gets a sandboxed code reward without naming this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.process_runner import ProcessRunner
from dew.sandbox.reward import CodeReward

# Quickstart programs print one number: a second of CPU and a few seconds of wall time are
# plenty, and keep a runaway sample from stalling the rollout.
QUICKSTART_LIMITS = SandboxLimits(cpu_seconds=1.0, deadline_seconds=5.0)


@contextlib.contextmanager
def code_reward(workers: int = 2) -> Iterator[CodeReward]:
    """A ``CodeReward`` on a ``ProcessRunner`` fleet of ``workers`` threads, closed on exit."""
    with SandboxFleet(ProcessRunner(), limits=QUICKSTART_LIMITS, workers=workers) as fleet:
        yield CodeReward(fleet)

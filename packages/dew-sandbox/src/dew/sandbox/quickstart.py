"""The ``code_reward`` that ``dew quickstart --code`` finds through an entry point.

``dew`` may not import ``dew.sandbox``, so this distribution registers the factory below in
the ``dew.quickstart`` entry-point group (see ``pyproject.toml``); the quickstart looks it up
with ``importlib.metadata`` and gets a sandboxed code reward without naming this package.
``sandboxed_code_reward`` is the fleet-owning context both this factory and the ``code``
reward of ``dew train`` configs (``dew.sandbox.recipe``) are made of.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.process_runner import ProcessRunner
from dew.sandbox.reward import CodeReward
from dew.sandbox.runner import Runner

# Quickstart programs print one number: a second of CPU and a few seconds of wall time are
# plenty, and keep a runaway sample from stalling the rollout.
QUICKSTART_LIMITS = SandboxLimits(cpu_seconds=1.0, deadline_seconds=5.0)


@contextlib.contextmanager
def sandboxed_code_reward(
    make_runner: Callable[[], Runner],
    limits: SandboxLimits,
    workers: int,
    *,
    all_or_nothing: bool = False,
) -> Iterator[CodeReward]:
    """A ``CodeReward`` on a fleet of ``workers`` threads over ``make_runner()``, closed on
    exit (normal or not), which stops its running programs and closes the runner.

    The runner is made only on entry, so a container engine is reached when the fleet starts,
    not when the arguments are checked.

    Each program is started with fork and exec from a process where JAX runs threads, and
    Python warns about that on every fork. The risk it names, a child stuck on a lock copied
    mid-use before it reaches exec, costs one sample here: the fleet kills the child at its
    deadline and the sample scores 0. So the warning is silenced instead of printed once per
    sampled program.
    """
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    with SandboxFleet(make_runner(), limits=limits, workers=workers) as fleet:
        yield CodeReward(fleet, all_or_nothing)


def code_reward(workers: int = 2) -> contextlib.AbstractContextManager[CodeReward]:
    """A ``CodeReward`` on a ``ProcessRunner`` fleet of ``workers`` threads under
    ``QUICKSTART_LIMITS``, closed on exit (see ``sandboxed_code_reward``)."""
    return sandboxed_code_reward(ProcessRunner, QUICKSTART_LIMITS, workers)

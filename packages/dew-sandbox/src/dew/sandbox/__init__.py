"""Run untrusted programs under limits, in host processes or containers, and score code.

Public names:

* :class:`SandboxLimits` - CPU seconds, wall deadline, address space, memory, output,
  processes.
* :class:`Program` - files, argv (no shell) and stdin.
* :class:`Outcome` and :class:`Verdict` - what a run produced.
* :class:`ProcessRunner` - limited host processes (same user, filesystem, network).
* :class:`ContainerRunner` - a fresh network-less container per program (docker SDK).
* :class:`SandboxFleet` - many programs on N threads, outcomes in order.
* :class:`CodeReward` - the last Python block of a completion against stdin/stdout cases.
* :class:`SubprocessEnvironment` - a tool-episode environment served by a worker process
  over JSON lines (duck-typed to dew's episode protocol).
* :class:`SandboxRegrader` and :class:`RegradeError` - a tool episode's final artifact
  (files of the worker's directory) scored again in a fresh sandbox.
"""

from dew.sandbox.container_runner import ContainerRunner, engine_unavailable_reason
from dew.sandbox.fleet import SandboxFleet
from dew.sandbox.launcher import SandboxCancelled
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome, Verdict
from dew.sandbox.process_runner import ProcessRunner
from dew.sandbox.program import Program
from dew.sandbox.regrade import RegradeError, SandboxRegrader
from dew.sandbox.reward import CodeReward
from dew.sandbox.subprocess_environment import (
    SubprocessEnvironment,
    SubprocessEnvironmentError,
    SubprocessSession,
)

__all__ = [
    "CodeReward",
    "ContainerRunner",
    "Outcome",
    "Program",
    "ProcessRunner",
    "RegradeError",
    "SandboxCancelled",
    "SandboxFleet",
    "SandboxLimits",
    "SandboxRegrader",
    "SubprocessEnvironment",
    "SubprocessEnvironmentError",
    "SubprocessSession",
    "Verdict",
    "engine_unavailable_reason",
]

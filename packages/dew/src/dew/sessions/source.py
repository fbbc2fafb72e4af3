"""``SessionSource``: what turns a ``Task`` into a future ``Session`` (host side).

A session source is any harness that runs one rollout of a task: a single completion drawn
from an inference engine and scored (``dew.rollout.PromptSource``), a multi-turn episode
(``dew.rollout.EnvironmentSource``), or an external agent harness whose calls a recording
gateway returns. The scheduler that drives it (``dew.rollout.RolloutScheduler``) only ever
calls the two methods below, from one thread, and owns the relabelling: whatever ``group``,
``sample`` and ``attempt`` a source writes on its sessions are replaced by the scheduler's.

Contract for implementers:

- ``submit(task, seed=...)`` starts one rollout and returns at once. The future resolves to a
  ``Session`` whose ``status`` says how it ended; failures of the policy or of the
  infrastructure are statuses (``AGENT_ERROR``, ``INFRA_ERROR``, ``TRUNCATED``), not
  exceptions. A future that raises means the source itself is broken: the scheduler cancels
  the batch's other work and re-raises it. ``seed`` is a nonnegative int that fixes every
  random choice the rollout makes (the engine's sampling seed), so resubmitting a task with
  the same seed under the same weights draws the same tokens; that is how a resumed run
  reproduces the work a crash interrupted.
- Each ``Call`` of the session carries the policy version served when that call was
  submitted (``Call.version``); the session's staleness is its oldest call's.
- ``cancel(future)`` asks the rollout to stop and returns without waiting. The future then
  resolves soon to a ``CANCELLED`` session (or is itself cancelled); a rollout that already
  finished keeps its result. Cancelling must release whatever the rollout holds (an
  environment, a sandbox, an engine request). Cancelling an unknown or finished future is a
  no-op.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from dew.sessions.records import Session, Task


@runtime_checkable
class SessionSource(Protocol):
    """Runs rollouts of tasks: ``submit`` one (a future ``Session``), ``cancel`` one."""

    def submit(self, task: Task, *, seed: int) -> Future[Session]:
        """Start one rollout of ``task`` seeded by ``seed``; return its future at once."""
        ...

    def cancel(self, future: Future[Session]) -> None:
        """Ask the rollout behind ``future`` to stop, without waiting for it."""
        ...


__all__ = ["SessionSource"]

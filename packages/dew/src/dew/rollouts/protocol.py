"""``Rollout``: what ``dew.trainer.Trainer`` calls between steps (its ``rollout=`` hook).

Before each compiled update the Trainer calls ``rollout(params, batch, key)`` with

- ``params``: the current parameters (valid until that update donates them),
- ``batch``: the host batch its data stream produced for the step (a mapping of arrays),
- ``key``: a PRNG key of its own for this step,

and trains on the mapping it returns instead of ``batch``. When the rollout also has an
``at_step(step, updates)`` method (``SteppedRollout``), the Trainer calls it first with the
number of the step being attempted and the optimizer updates committed so far; the Trainer
looks the method up with ``getattr``, so a plain function is a ``Rollout`` too.

The implementations in Dew:

- ``dew.rollouts.sampled.SampledRollout``: samples GRPO completions with ``dew.inference``,
  scores them with a reward function and packs one-call sessions;
- ``dew.rollouts.episodes.rollout.EpisodeRollout``: multi-turn tool episodes against an
  ``Environment``, with ``at_step`` (the clocks stamped on the collection it makes next);
- ``dew.rollouts.ppo.PPORollout``: an ``EpisodeRollout`` cohort plus the critic's values and
  GAE targets for ``PPOObjective`` (``at_step`` passes through to the episodes);
- ``dew.rollout.RolloutScheduler`` (the ``dew-rollout`` distribution): packs sessions
  drawn asynchronously from a rollout server, with ``at_step`` (the Trainer's clock);
- ``dew.flow.rollout.FlowRollout`` (the ``dew-flow`` distribution): samples rectified-flow
  SDE trajectories for Flow-GRPO.

This module imports nothing of ``dew``: the trainer reads it, and the trainer knows no
collector.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Rollout(Protocol):
    """A host function ``(params, batch, key) -> batch`` the Trainer calls before each update."""

    def __call__(self, params: Any, batch: Any, key: Any, /) -> Mapping[str, Any]:
        """The batch to train this step on, made from ``batch`` with ``params`` and ``key``."""
        ...


@runtime_checkable
class SteppedRollout(Rollout, Protocol):
    """A ``Rollout`` that is also told which step comes next (``at_step``)."""

    def at_step(self, step: int, updates: int, /) -> None:
        """Called before ``__call__`` with the step being attempted and the updates so far."""
        ...

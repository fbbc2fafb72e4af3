"""Rollouts: the collectors the Trainer calls between steps (host side).

Each one is a ``rollout=`` hook of ``dew.trainer.Trainer`` (the ``Rollout`` protocol of
``dew.rollouts.protocol``): it takes the Trainer's batch and variables, samples, scores and
returns a packed batch built from ``dew.sessions``.

- ``protocol``: ``Rollout`` (and ``SteppedRollout``, one with ``at_step``), what the Trainer
  calls.
- ``sampled``: ``SampledRollout``, which samples completions with ``dew.inference``, scores
  them with a reward function and packs them; ``RewardError``, ``default_decode``.
- ``episodes``: ``EpisodeRollout``, multi-turn tool episodes (the environment protocol, one
  action validation, cohorts over processes, the crash-safe ``EpisodeJournal``).
- ``ppo``: ``PPORollout`` and ``episode_targets`` (GAE over packed episodes for PPO).
- ``policy``: ``SubtreePolicy``, a sampler bound to the policy part of a larger tree.

Names resolve lazily: importing the package (or its ``protocol``) imports no collector, and
each name imports only its own module.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES: dict[str, str] = {
    "Rollout": "protocol",
    "SteppedRollout": "protocol",
    "RewardError": "sampled",
    "SampledRollout": "sampled",
    "default_decode": "sampled",
    "EpisodeCancelled": "episodes",
    "EpisodeFailure": "episodes",
    "EpisodeJournal": "episodes",
    "EpisodeRollout": "episodes",
    "PPORollout": "ppo",
    "SingleActionError": "ppo",
    "episode_targets": "ppo",
    "SubtreePolicy": "policy",
}


# Like dew.objectives.rl's: a module-level __getattr__ serves only its own package, so each
# lazy package keeps its own three lines over its own table.
def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.rollouts' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dew.rollouts.{module}"), name)


__all__ = sorted(_NAMES)

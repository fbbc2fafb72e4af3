"""Rollout machinery that runs inside the trainer, apart from the losses (host side).

- the session records, chains, advantages, packing, metrics and verl interop moved to
  ``dew.sessions``; their names are still found here.
- ``sampled``: ``SampledRollout``, the Trainer's ``rollout=`` hook that samples completions
  with ``dew.inference``, scores them with a reward function and packs them.
- ``ppo``: ``PPORollout`` and ``episode_targets`` (GAE over packed episodes for PPO).
- ``policy``: ``SubtreePolicy``, a sampler bound to the policy part of a larger tree.

Names resolve lazily, so reading the records does not import the inference engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES: dict[str, str] = {
    "Call": "dew.sessions.records",
    "Session": "dew.sessions.records",
    "Status": "dew.sessions.records",
    "Task": "dew.sessions.records",
    "SessionSource": "dew.sessions.source",
    "TRUNCATIONS": "dew.sessions.chains",
    "ESTIMATORS": "dew.sessions.advantages",
    "GROUP_EPSILON": "dew.sessions.advantages",
    "group_advantages": "dew.sessions.advantages",
    "chain_lengths": "dew.sessions.packing",
    "pack": "dew.sessions.packing",
    "rows_needed": "dew.sessions.packing",
    "session_metrics": "dew.sessions.metrics",
    "RewardError": "dew.objectives.rollouts.sampled",
    "SampledRollout": "dew.objectives.rollouts.sampled",
    "default_decode": "dew.objectives.rollouts.sampled",
    "PPORollout": "dew.objectives.rollouts.ppo",
    "SingleActionError": "dew.objectives.rollouts.ppo",
    "episode_targets": "dew.objectives.rollouts.ppo",
    "SubtreePolicy": "dew.objectives.rollouts.policy",
    "VerlRowError": "dew.sessions.verl",
    "VerlTrajectory": "dew.sessions.verl",
    "from_verl": "dew.sessions.verl",
    "to_verl": "dew.sessions.verl",
}


# Like dew.objectives.rl's: a module-level __getattr__ serves only its own package, so each
# lazy package keeps its own three lines over its own table.
def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.objectives.rollouts' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)

"""RL objectives: the losses (DPO, GRPO, PPO with its ``ValueHead``).

The batches they train on come from the collectors in ``dew.rollouts``, built from the session
records of ``dew.sessions``. Their public names (``SampledRollout``, ``RewardError``,
``EpisodeRollout`` and the episode errors, ``PPORollout``, the ``sessions`` module) are also
found here, and so is the ``verl`` interop module (``to_verl``, ``from_verl``): this is the
path the RL objectives and their batches are imported from. Names resolve lazily so
importing one objective does not import every other one (nor the inference engine).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES: dict[str, str] = {
    "DPOObjective": "dew.objectives.rl.dpo",
    "EpisodeCancelled": "dew.rollouts.episodes",
    "EpisodeFailure": "dew.rollouts.episodes",
    "EpisodeJournal": "dew.rollouts.episodes",
    "EpisodeRollout": "dew.rollouts.episodes",
    "GRPOObjective": "dew.objectives.rl.grpo",
    "PPOObjective": "dew.objectives.rl.ppo",
    "PPORollout": "dew.rollouts.ppo",
    "packed_log_probs": "dew.objectives.rl.grpo",
    "policy_loss_from_log_probs": "dew.objectives.rl.grpo",
    "RewardError": "dew.rollouts.sampled",
    "SampledRollout": "dew.rollouts.sampled",
    "ValueHead": "dew.objectives.rl.value_head",
    "sessions": "dew.objectives.rl.sessions",
    "verl": "dew.objectives.rl.verl",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.objectives.rl' has no attribute {name!r}")
    if name == module.rsplit(".", 1)[1]:
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)

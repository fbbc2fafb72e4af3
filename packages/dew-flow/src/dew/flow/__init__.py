"""dew.flow: rectified-flow models, flow matching and Flow-GRPO on the dew Trainer.

Names resolve lazily, so ``import dew.flow`` stays light until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES: dict[str, str] = {
    "Field": "dew.flow.inputs",
    "InputSpec": "dew.flow.inputs",
    "InputError": "dew.flow.inputs",
    "Process": "dew.flow.process",
    "transition_kl": "dew.flow.process",
    "coordinate_log_density": "dew.flow.process",
    "SimpleDiT": "dew.flow.models",
    "LabelEncoder": "dew.flow.models",
    "TokenEncoder": "dew.flow.models",
    "DiffusionObjective": "dew.flow.objective",
    "FlowGRPOObjective": "dew.flow.grpo",
    "FlowRollout": "dew.flow.rollout",
    "RewardError": "dew.flow.rollout",
    "group_advantages": "dew.flow.rollout",
    "FlowTrajectory": "dew.flow.trajectory",
    "sample_trajectory": "dew.flow.trajectory",
    "row_noise": "dew.flow.trajectory",
    "models": "dew.flow.models",
    "presets": "dew.flow.presets",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.flow' has no attribute {name!r}")
    if name == module.rsplit(".", 1)[1]:
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)

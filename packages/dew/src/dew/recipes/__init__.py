"""Recipes that combine Dew's pieces: ``dew.recipes.chain`` (SFT, DPO and GRPO stages) and
``dew.recipes.builder`` (the model, optimizer and schedule from a config, shared by
``dew train``, ``dew chain`` and the quickstart).

Names resolve lazily so ``import dew.recipes`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Recipe": "dew.recipes.chain",
    "Stage": "dew.recipes.chain",
    "ModelConfig": "dew.recipes.builder",
    "OptimizerConfig": "dew.recipes.builder",
    "ScheduleConfig": "dew.recipes.builder",
    "build_model": "dew.recipes.builder",
    "build_optimizer": "dew.recipes.builder",
    "build_schedule": "dew.recipes.builder",
    "ConfigError": "dew.recipes.schema",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'dew.recipes' has no attribute {name!r}")

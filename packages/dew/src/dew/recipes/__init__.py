"""Recipes that combine Dew's pieces: ``dew.recipes.chain`` (SFT, DPO and GRPO stages).

Names resolve lazily so ``import dew.recipes`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Recipe", "Stage"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("dew.recipes.chain"), name)
    raise AttributeError(f"module 'dew.recipes' has no attribute {name!r}")

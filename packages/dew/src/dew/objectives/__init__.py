"""Objectives: what the Trainer minimises.

``Objective`` is the protocol (see ``dew.objectives.base``); ``LMObjective`` is the next-token
loss for pretraining and SFT. The RL objectives live in ``dew.objectives.rl``.
"""

from dew.objectives.base import Objective, validate_ema_decay

__all__ = ["LMObjective", "Objective", "validate_ema_decay"]


def __getattr__(name: str):  # lazy: lm imports dew.models, which may be absent early on
    if name == "LMObjective":
        from dew.objectives.lm import LMObjective

        return LMObjective
    raise AttributeError(f"module 'dew.objectives' has no attribute {name!r}")

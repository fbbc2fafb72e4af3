"""Objectives: what the Trainer minimises.

``Objective`` is the protocol (see ``dew.objectives.base``); ``LMObjective`` is the next-token
loss for pretraining and SFT; ``MaskedDiffusionObjective`` is MDLM's masked diffusion loss
(its math in ``dew.objectives.diffusion``); ``BlockDiffusionObjective`` is BD3-LM's block
diffusion loss (``dew.objectives.block_diffusion``). The RL objectives live in ``dew.objectives.rl``.
"""

from dew.lazy import lazy_exports
from dew.objectives.base import Objective, validate_ema_decay

# Lazy: lm imports dew.models, which may be absent early on.
__getattr__, __dir__, _lazy = lazy_exports(
    __name__,
    {
        "BlockDiffusionObjective": ".block_diffusion",
        "LMObjective": ".lm",
        "MaskedDiffusionObjective": ".masked_diffusion",
    },
)

__all__ = [
    "BlockDiffusionObjective",
    "LMObjective",
    "MaskedDiffusionObjective",
    "Objective",
    "validate_ema_decay",
]

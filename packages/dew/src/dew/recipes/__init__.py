"""Recipes that combine Dew's pieces: ``dew.recipes.chain`` (SFT, DPO and GRPO stages) and
``dew.recipes.builder`` (the model, optimizer and schedule from a config, shared by
``dew train``, ``dew chain`` and the quickstart).

Names resolve lazily so ``import dew.recipes`` stays light.
"""

from dew.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Recipe": ".chain",
        "Stage": ".chain",
        "ModelConfig": ".builder",
        "OptimizerConfig": ".builder",
        "ScheduleConfig": ".builder",
        "build_model": ".builder",
        "build_optimizer": ".builder",
        "build_schedule": ".builder",
        "ConfigError": ".schema",
    },
)

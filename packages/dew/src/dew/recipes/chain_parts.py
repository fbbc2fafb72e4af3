"""What one text stage of a ``dew.recipes.chain.Recipe`` trains with.

``stage_parts(recipe, stage, start, index)`` gives the stage's objective, its rollout (None
unless GRPO or PPO), the data (None: the stage's own dataset) and the run directory's
``start`` callback (None: nothing to open), for a stage starting from the policy variables
``start`` (None: a fresh initialisation). A stage on tool episodes (an environment
``source``) is built by ``dew.recipes.environment_run``; every other stage by
``dew.recipes.stages.build_stage``. ``stage_seed(key, index)`` is the int seed of stage
``index``.
"""

from __future__ import annotations

from typing import Any

import jax

from dew.recipes.chain_lora import stage_adapter
from dew.recipes.shaping_config import SHAPING_KEYS
from dew.recipes.stages import LOSS_KEYS, build_stage


def stage_parts(
    recipe: Any, stage: Any, start: Any, index: int, base_path: str | None = None
) -> tuple[Any, Any, Any, Any]:
    """The objective, the rollout, the data (None: the stage's dataset) and the run
    directory's ``start`` callback (None: nothing to open) of ``stage``; a stage with a
    ``lora`` trains an adapter on ``start``, recording ``base_path`` as its base
    (``dew.recipes.chain_lora``)."""
    data, kind = stage.data, str(stage.kind)  # Stage.__post_init__ resolved the kind
    options: dict[str, Any] = {}
    grpo = {"beta": stage.beta, "groups": stage.groups,
            "max_new_tokens": stage.max_new_tokens, "temperature": stage.temperature,
            "top_k": stage.sample, "eos_id": stage.eos_id, "estimator": stage.estimator,
            **{key: getattr(stage, key) for key in (*LOSS_KEYS, *SHAPING_KEYS)}}  # fmt: skip
    if stage.source is not None:  # tool episodes (dew.recipes.environment_run)
        from dew.recipes.environment_run import episode_parts

        chosen = stage.ppo_options() if kind == "ppo" else grpo
        asynchronous = stage.rollout is not None and stage.rollout.is_async
        parts = episode_parts(stage.source, recipe.model, chosen, pretrained=start,
                              batch=recipe.batch, seed=stage_seed(recipe.key, index),
                              progress=recipe.progress, kind=kind,
                              where=f"Stage.source ({stage.name})",
                              asynchronous=asynchronous)  # fmt: skip
        return parts["objective"], parts["rollout"], parts["data"], parts["start"]
    if stage.kind == "dpo":
        options = {"beta": stage.beta, "nll_weight": stage.nll_weight}
        width = data.seq_len
    elif stage.kind == "ppo":
        options = stage.ppo_options()
        width = data.max_prompt_len + stage.max_new_tokens
    elif stage.kind == "grpo":
        options = grpo
        width = data.max_prompt_len + stage.max_new_tokens
    else:  # an SFT or LM row is seq_len + 1 ids wide
        width = data.seq_len + 1
    objective, rollout = build_stage(kind, recipe.model, width, options, pretrained=start,
                                     reward=stage.reward, decode=stage.decode,
                                     where=f"Stage ({stage.name})",
                                     adapter=stage_adapter(stage, base_path))  # fmt: skip
    return objective, rollout, None, None


def stage_seed(key: jax.Array, index: int) -> int:
    """An int seed for stage ``index`` drawn from the chain's key."""
    return int(jax.random.randint(jax.random.fold_in(key, index), (), 0, 2**31 - 1))


__all__ = ["stage_parts", "stage_seed"]

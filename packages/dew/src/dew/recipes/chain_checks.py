"""The checks of one ``dew.recipes.chain.Stage``: its name, data, kind and every option.

``check_stage(stage)`` runs from ``Stage.__post_init__`` and returns the stage's kind (the
``kind`` given, checked against the dataset, or the first kind that fits it, ``stage_kind``).
Each refusal is a one-line ``ValueError`` or ``TypeError`` of the form
``Stage.<field> (<stage name>): expected ..., got ...``; ``dew chain`` prefixes the stage's
config key (``stages.N: ...``).
"""

from __future__ import annotations

import math
import os
from typing import Any

from dew.checks import is_int
from dew.data.chat import ChatMessages
from dew.data.preference import PreferencePairs
from dew.data.prompts import Prompts
from dew.data.tokens import TokenFile
from dew.recipes.ppo_stage import PPO_KEYS, checked_options
from dew.recipes.rollout_config import RolloutConfig
from dew.recipes.shaping_config import shaping_parts
from dew.recipes.stages import LOSS_KEYS
from dew.sessions.advantages import check_estimator

#: The Stage fields only a PPO stage takes.
PPO_ONLY = ("gamma", "lam", "value_coefficient", "value_clip", "critic_from_policy")


def check_stage(stage: Any) -> str:
    """Check ``stage`` (a ``Stage`` whose ``kind`` may still be None) and return its kind."""
    name = stage.name
    if not isinstance(name, str) or name in ("", ".", "..") or os.sep in name:
        raise ValueError(f"Stage.name: expected a plain directory name, got {name!r}")
    if stage.source is not None:
        from dew.recipes.source_config import check_source_stage

        check_source_stage(stage)
    elif not isinstance(stage.data, ChatMessages | PreferencePairs | Prompts | TokenFile):
        raise TypeError(
            f"Stage.data ({name}): expected ChatMessages, PreferencePairs, Prompts or "
            f"TokenFile, got {type(stage.data).__name__}"
        )
    if not is_int(stage.steps) or stage.steps < 1:
        raise ValueError(f"Stage.steps ({name}): expected a positive int, got {stage.steps!r}")
    kind = stage_kind(name, stage.data, stage.kind, stage.source)
    _check_ppo(stage, kind)
    data_type = type(stage.data).__name__
    if isinstance(stage.data, Prompts) and stage.reward is None:
        raise ValueError(f"Stage.reward ({name}): a Prompts (GRPO) stage needs a reward")
    if isinstance(stage.data, Prompts):
        needs = getattr(stage.reward, "needs", ())
        stage.data.check_fields(needs, f"Stage.data ({name})", "the stage's reward")
    if not isinstance(stage.data, Prompts) and stage.reward is not None:
        raise ValueError(
            f"Stage.reward ({name}): only a Prompts (GRPO) stage takes a reward, this "
            f"stage's data is {data_type}"
        )
    if stage.nll_weight is not None and not isinstance(stage.data, PreferencePairs):
        raise ValueError(
            f"Stage.nll_weight ({name}): only a PreferencePairs (DPO) stage takes it, "
            f"this stage's data is {data_type}"
        )
    if stage.rollout is not None and not isinstance(stage.rollout, RolloutConfig):
        raise TypeError(
            f"Stage.rollout ({name}): expected a RolloutConfig or None, "
            f"got {type(stage.rollout).__name__}"
        )
    _check_sampling(stage)
    _check_lora(stage)
    return kind


def _check_lora(stage: Any) -> None:
    """Refuse a ``lora`` that is not a ``LoraConfig``, and one on tool episodes or with an
    asynchronous rollout on an engine that cannot swap adapters, SGLang
    (``lora_rollout_problem``)."""
    from dew.models.lora import LoraConfig
    from dew.recipes.lora_config import lora_rollout_problem

    if stage.lora is None:
        return
    if not isinstance(stage.lora, LoraConfig):
        raise TypeError(
            f"Stage.lora ({stage.name}): expected a LoraConfig or None, "
            f"got {type(stage.lora).__name__}"
        )
    problem = lora_rollout_problem(stage.rollout, stage.source)
    if problem is not None:
        raise ValueError(f"Stage.{problem[0]} ({stage.name}): {problem[1]}")


def _check_sampling(stage: Any) -> None:
    """Refuse sampling, loss and shaping options on a stage that does not sample, and check
    their values."""
    name, data_type = stage.name, type(stage.data).__name__
    rollout_options = {
        "rollout": stage.rollout,
        "temperature": stage.temperature,
        "eos_id": stage.eos_id,
        "decode": stage.decode,
        "estimator": None if stage.estimator == "group" else stage.estimator,
    }
    try:
        check_estimator(stage.estimator)
    except ValueError as err:
        raise ValueError(f"Stage.{err}".replace(":", f" ({name}):", 1)) from None
    samples = isinstance(stage.data, Prompts) or stage.source is not None
    for option, value in rollout_options.items():
        if value is not None and not samples:
            raise ValueError(
                f"Stage.{option} ({name}): only a Prompts (GRPO) stage samples, this "
                f"stage's data is {data_type}"
            )
    temperature = stage.temperature
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not temperature > 0
        or not math.isfinite(temperature)
    ):
        raise ValueError(
            f"Stage.temperature ({name}): expected a finite number > 0, got {temperature!r}"
        )
    for option in [*stage.changed_loss_options(), *stage.changed_shaping_options()]:
        if not samples:
            raise ValueError(
                f"Stage.{option} ({name}): only a Prompts (GRPO) stage takes it, "
                f"this stage's data is {data_type}"
            )
    stage.check_loss(lambda key: f"Stage.{key} ({name})")
    label = lambda k: f"Stage.{k} ({name})"  # noqa: E731
    shaping_parts({**stage.shaping_options(), **stage.loss_options()}, label, stage.max_new_tokens)
    if stage.decode is not None and not callable(stage.decode):
        raise TypeError(
            f"Stage.decode ({name}): expected a callable ids -> str, "
            f"got {type(stage.decode).__name__}"
        )


def _check_ppo(stage: Any, kind: str) -> None:
    """Refuse PPO keys on another kind and GRPO-only loss keys on a PPO stage."""
    for option in PPO_ONLY:
        if getattr(stage, option) is not None and kind != "ppo":
            raise ValueError(
                f"Stage.{option} ({stage.name}): only a PPO stage takes it, this stage's "
                f"kind is {kind}"
            )
    if kind == "ppo":
        checked_options(stage.ppo_options(), lambda key: f"Stage.{key} ({stage.name})")
        for option in stage.changed_loss_options():
            if option not in PPO_KEYS:
                raise ValueError(
                    f"Stage.{option} ({stage.name}): a PPO stage does not take it (PPO's loss "
                    f"keys: {', '.join(k for k in LOSS_KEYS if k in PPO_KEYS)})"
                )


def stage_kind(name: str, data: Any, kind: str | None, source: Any = None) -> str:
    """A stage's kind: ``kind`` checked against the dataset (or an environment ``source``,
    which trains GRPO or PPO), or the first kind that fits."""
    allowed = ("grpo", "ppo") if source is not None else ("sft", "lm") if isinstance(
        data, ChatMessages) else ("dpo",) if isinstance(
        data, PreferencePairs) else ("lm",) if isinstance(
        data, TokenFile) else ("grpo", "ppo")  # fmt: skip
    if kind is None:
        return allowed[0]
    if kind not in allowed:
        what = "an environment source" if source is not None else f"{type(data).__name__} data"
        raise ValueError(
            f"Stage.kind ({name}): expected {' or '.join(allowed)} for {what}, got {kind!r}"
        )
    return kind


__all__ = ["PPO_ONLY", "check_stage", "stage_kind"]

"""LoRA in ``dew chain``: the ``lora`` section, and what an adapter stage hands on.

::

    lora: {rank: 8, alpha: 16, targets: [q_proj, v_proj]}   # every text stage
    stages:
      - {name: sft, ...}                   # an adapter with the top-level keys
      - {name: dpo, lora: {rank: 4}, ...}  # its own keys over the top-level ones
      - {name: grpo, lora: false, ...}     # every weight trains (null says the same)

The keys, their defaults and their checks are ``dew train``'s (``dew.recipes.lora_config``).
A bad top-level key is named ``lora.<key>``, a stage's ``stages.N.lora.<key>`` (its merged
section), and a target the decoder lacks ``stages.N.lora.targets`` once the model is built.
Every text kind trains an adapter: ``lm``, ``sft``, ``dpo`` and ``grpo`` through
``LoraObjective``, ``ppo`` through ``LoraPPOObjective`` (the critic trains in full); the
reference of DPO, GRPO and PPO is the stage's base with the adapter off. A stage on tool
episodes (``source``) refuses an adapter, and so does one with ``rollout.mode async`` on
SGLang (vLLM and the native server swap adapters at run time), as ``dew train`` does; a flow
stage ignores the top-level section.

Hand-off: an adapter stage passes on merged weights, not base + adapter. When it ends (or,
finished, restores) it writes ``OUTPUT/<stage>/adapter`` (PEFT's layout, its base recorded as
the stage's base directory) and ``OUTPUT/<stage>/merged`` (the base with the adapter folded
in, float32, in the Hugging Face layout: ``dew generate`` and ``dew eval`` read it when given
the stage directory), and the next stage starts from the weights read back from ``merged``.
A rerun restores the finished stage and reads ``merged`` again instead of recomputing it, so
the next stage's base, whose SHA-256 its checkpoints record, is the same bits on any machine
and a killed stage resumes against it. The next stage is free to train every weight, or a
new adapter of its own on top of the merged weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dew.recipes.schema import ConfigError, section

#: The directories an adapter stage writes beside its checkpoints.
ADAPTER = "adapter"
MERGED = "merged"
_OFF = (None, False)


def top_lora(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The top-level ``lora`` mapping, checked on its own (errors ``lora.<key>``)."""
    from dew.recipes.lora_config import LoraSection

    raw = config.get("lora")
    if raw in _OFF:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"lora: expected a mapping of lora keys, got {raw!r}")
    section(LoraSection, raw, "lora")
    return raw


def stage_lora(config: Mapping[str, Any], spec: dict[str, Any], where: str) -> Any:
    """The ``LoraConfig`` of the stage ``spec`` (its ``lora`` key popped), or None."""
    from dew.recipes.lora_config import LoraSection

    top = top_lora(config)
    own = spec.pop("lora", top)
    if own in _OFF:
        return None
    if not isinstance(own, Mapping):
        raise ConfigError(
            f"{where}.lora: expected a mapping of lora keys, or false for a stage that trains "
            f"every weight, got {own!r}"
        )
    merged = {**(top or {}), **own}
    return section(LoraSection, merged, f"{where}.lora").lora_config()


def check_lora_targets(stages: Sequence[Any], model: Any) -> None:
    """Refuse a stage whose adapter targets no projection of ``model`` (or a rank above a
    target's size), naming ``stages.N.lora.<key>``."""
    from dew.models.lora import select_targets

    for i, stage in enumerate(stages):
        lora = getattr(stage, "lora", None)
        if lora is None:
            continue
        try:
            select_targets(model.config, lora)
        except ValueError as err:
            raise ConfigError(f"stages.{i}.lora.{err}") from None


def stage_adapter(stage: Any, base_path: str | None) -> Any:
    """``build_stage``'s ``adapter`` for ``stage`` (None when it trains every weight)."""
    if stage.lora is None:
        return None
    from dew.recipes.lora_config import lora_objective

    return lambda objective: lora_objective(objective, stage.lora, base_path)


def hand_off(objective: Any, state: Any, stage_dir: Path, model: Any) -> dict[str, Any]:
    """Write ``stage_dir/adapter`` and ``stage_dir/merged`` unless ``merged`` exists, and
    return the plain variables ``{"params": ...}`` read back from ``merged``, each leaf in
    its base's dtype (see the module docstring)."""
    import jax
    import numpy as np

    from dew import models
    from dew.models.lora import BASE

    merged_dir = stage_dir / MERGED
    if not (merged_dir / "config.json").is_file():
        objective.save_adapter(stage_dir / ADAPTER, state.params)
        merged = jax.device_get(objective.merged(state.params))
        partial = stage_dir / f"{MERGED}.partial"
        models.Pretrained.from_model(model, merged).save(partial, dtype="float32")
        os.replace(partial, merged_dir)  # merged/ appears whole or not at all
    loaded = models.load_pretrained(str(merged_dir), dtype="float32")
    base = jax.device_get(objective.reference_of(state.params)[BASE])
    params = jax.tree.map(
        lambda new, old: np.asarray(new).astype(np.asarray(old).dtype),
        dict(loaded.variables)["params"],
        base,
    )
    return {"params": params}


__all__ = ["ADAPTER", "MERGED", "check_lora_targets", "hand_off", "stage_adapter",
           "stage_lora", "top_lora"]  # fmt: skip

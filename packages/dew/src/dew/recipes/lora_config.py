"""The ``lora`` section of a ``dew train`` config: train an adapter instead of every weight.

::

    lora: {rank: 8, alpha: 16, targets: [q_proj, v_proj], dropout: 0.05, rslora: false}

``targets`` is a list of projection names (or name suffixes) or one regular expression
over whole module names, as in PEFT (``dew.models.lora.LoraConfig``); a string of plain
names separated by commas (``q_proj,v_proj``, or one name) is read as that list. The flags
``--lora-rank``, ``--lora-alpha`` and ``--lora-targets`` (comma-separated names) set the
same keys. With the section, the stage's objective is wrapped in
``dew.objectives.lora.LoraObjective`` (the base frozen, the reference the adapter-off
base; ``dew train lm``'s diffusion objectives too, their non-causal and two-copy passes
running through the adapter); ``dew train ppo``'s in ``dew.objectives.lora_ppo.LoraPPOObjective``, where the
adapter sits on the policy and the critic (``ValueHead``) still trains every weight. At the
end the adapter is written to ``RUN_DIR/adapter`` in PEFT's layout, and ``run.export``
receives the merged weights (PPO: the policy's alone, without the critic).

With ``rollout.mode: async`` the adapter is served by a vLLM engine (``rollout.engine.kind:
vllm``): launched with run-time adapters on, or joined at a url it was started with
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; each push loads the
adapter alone (``dew.rollout.AdapterReload``), the base staying as the engine loaded it.
Or by Dew's own server (``kind: native``), which runs the ``LoraDecoder`` unmerged: each push
swaps the adapter beside the base it started with. SGLang and tool episodes are refused
(``lora_rollout_problem``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from dew.recipes.schema import ConfigError, section

_NAMES = re.compile(r"\s*[\w.]+\s*(,\s*[\w.]+\s*)*")
#: The kinds whose objective trains an adapter (every ``dew train`` kind).
LORA_KINDS = ("lm", "sft", "dpo", "grpo", "ppo")
#: The rollout engines that swap adapters at run time (SGLang does not, here).
ADAPTER_ENGINES = ("vllm", "native")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """Rank, alpha, targets, dropout and rsLoRA of the adapter (``LoraConfig``'s fields)."""

    rank: int = 8
    alpha: float = 16.0
    targets: Any = ("q_proj", "k_proj", "v_proj", "o_proj")
    dropout: float = 0.0
    rslora: bool = False

    def __post_init__(self) -> None:
        targets = self.targets
        if isinstance(targets, str) and _NAMES.fullmatch(targets):  # "q_proj,v_proj"
            targets = tuple(t.strip() for t in targets.split(","))
        elif isinstance(targets, list | tuple):
            targets = tuple(targets)
        object.__setattr__(self, "targets", targets)
        self.lora_config()

    def lora_config(self) -> Any:
        """The ``LoraConfig``; a bad value is a ``ConfigError`` naming ``lora.<key>``."""
        from dew.models.lora import LoraConfig

        try:
            return LoraConfig(
                rank=self.rank,
                alpha=self.alpha,
                targets=self.targets,
                dropout=self.dropout,
                rslora=self.rslora,
            )
        except ValueError as err:
            raise ConfigError(f"lora.{err}") from None


def lora_section(raw: Any, kind: str) -> LoraSection | None:
    """The checked ``lora`` section, or None when the config has none."""
    if raw is None:
        return None
    if kind not in LORA_KINDS:
        raise ConfigError(
            f"lora: expected no lora section for 'dew train {kind}' (only "
            f"{', '.join(LORA_KINDS)} train adapters), got {dict(raw) if isinstance(raw, Mapping) else raw!r}"
        )
    return section(LoraSection, raw, "lora")


def lora_rollout_problem(rollout: Any, source: Any) -> tuple[str, str] | None:
    """Why an adapter cannot be trained with ``rollout`` (a ``RolloutConfig`` or None) and
    ``source`` (tool episodes or None): ``(key, message)``, the key relative to the config
    root; None when it can."""
    if source is not None:
        return "lora", ("expected prompts from data (adapters are not served to tool "
                        "workers yet), got a source section")  # fmt: skip
    if rollout is None or not getattr(rollout, "is_async", False):
        return None
    kind = rollout.engine.kind
    if kind not in ADAPTER_ENGINES:
        return "rollout.engine.kind", (
            f"a lora section needs an engine that loads adapters at run time; expected "
            f"{' or '.join(ADAPTER_ENGINES)}, got {kind}")  # fmt: skip
    return None


def adapter_wrapper(lora: LoraSection, model: Any, base_path: str | None) -> Any:
    """``objective -> LoraObjective`` (``LoraPPOObjective`` for a ``PPOObjective``) for
    ``build_stage``; errors name ``lora.<key>``."""
    config = lora.lora_config()
    try:
        from dew.models.lora import select_targets

        select_targets(model.config, config)
    except ValueError as err:
        raise ConfigError(f"lora.{err}") from None

    return lambda objective: lora_objective(objective, config, base_path)


def lora_objective(objective: Any, config: Any, base_path: str | None) -> Any:
    """``objective`` training the adapter ``config`` (a ``LoraConfig``) on its frozen base:
    ``LoraPPOObjective`` for a ``PPOObjective`` (the critic trains in full), else
    ``LoraObjective``; ``base_path`` is recorded as the base's origin."""
    from dew.objectives.rl.ppo import PPOObjective

    if isinstance(objective, PPOObjective):
        from dew.objectives.lora_ppo import LoraPPOObjective

        return LoraPPOObjective(objective, config, base_path=base_path)
    from dew.objectives.lora import LoraObjective

    return LoraObjective(objective, config, base_path=base_path)


def export_adapter(objective: Any, state: Any, run_dir: str, export: str | None) -> Any:
    """Write ``RUN_DIR/adapter`` (PEFT's layout) and, when ``export`` is set, return the
    merged variables to save there (else None)."""
    import jax

    objective.save_adapter(os.path.join(run_dir, "adapter"), state.params)
    if not export:
        return None
    return jax.device_get(objective.merged(state.params))


__all__ = ["ADAPTER_ENGINES", "LORA_KINDS", "LoraSection", "adapter_wrapper", "export_adapter", "lora_objective",
           "lora_rollout_problem", "lora_section"]  # fmt: skip

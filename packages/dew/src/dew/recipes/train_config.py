"""The config of one ``dew train`` run: sections, their keys and the checks run before training.

A train config has seven sections (``kind`` picks the ``data`` and ``objective`` keys), and
a kind of ``ASYNC_KINDS`` an eighth, ``rollout`` (``dew.recipes.rollout_config``)::

    kind: sft                       # lm, sft, dpo, grpo or ppo
    run:       {run_dir: runs/sft, steps: 1000, batch: 8, log_every: 10, ...}   RunConfig
    model:     {name: qwen3, emb_features: 256, ...}       dew.recipes.builder.ModelConfig
    optimizer: {name: adamw, learning_rate: 3e-4, ...}     dew.recipes.builder.OptimizerConfig
    schedule:  {kind: cosine, warmup_steps: 100}           dew.recipes.builder.ScheduleConfig
    data:      {path: chat.jsonl, tokenizer: tok, seq_len: 256}   LMData/SFTData/DPOData/GRPOData
    objective: {ema_decay: null}                            LMObjectiveConfig/DPO.../GRPO...
    rollout:   {mode: async, ahead: 1, engine: {kind: native}}   (grpo, ppo) RolloutConfig
    lora:      {rank: 8, alpha: 16, targets: [q_proj, v_proj]}   dew.recipes.lora_config
    source:    {kind: environment, command: [...], tasks: 100}   (grpo, ppo) SourceConfig

A ``source`` of kind ``environment`` (``dew.recipes.source_config``) replaces the ``data``
section: the run trains on tool episodes against a worker process; one of kind ``harbor``
(``dew.recipes.harbor_config``) trains on Harbor trials behind a recording gateway.

PPO reads ``GRPOData`` and its ``objective`` section is
``dew.recipes.ppo_stage.PPOObjectiveConfig``.

``train_config(mapping, kind)`` checks every key and value (unknown keys are refused naming
the nearest valid one) and every local path, and returns a ``TrainConfig``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from dew.recipes.builder import (
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    model_config,
    optimizer_config,
    schedule_config,
)
from dew.recipes.diffusion_config import DIFFUSION_KEYS, check_diffusion
from dew.recipes.harbor_config import HarborConfig, harbor_section
from dew.recipes.lora_config import LoraSection, lora_rollout_problem, lora_section
from dew.recipes.ppo_stage import PPOObjectiveConfig
from dew.recipes.references import local_path
from dew.recipes.rollout_config import RolloutConfig, rollout_config
from dew.recipes.schema import ConfigError, directory_path, positive, section, unknown_key
from dew.recipes.shaping_config import RewardShapingOptions, shaping_parts
from dew.recipes.source_config import SourceConfig, source_section
from dew.recipes.stages import GRPOLoss

KINDS = ("lm", "sft", "dpo", "grpo", "ppo")
#: The kinds that sample completions of prompts and score them with a reward.
RL_KINDS = ("grpo", "ppo")
#: The kinds whose batches a ``rollout`` section may draw ahead (``dew.recipes.async_run``).
ASYNC_KINDS = ("grpo", "ppo")
SECTIONS = ("kind", "run", "model", "optimizer", "schedule", "data", "objective", "rollout",
            "source", "lora")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where and how long to train; see ``dew train lm --help`` for each key."""

    run_dir: str
    steps: int
    batch: int = 8
    microbatches: int = 1
    fsdp: bool = False
    seed: int = 0
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int = 100
    keep: int = 3
    tensorboard: bool = False
    export: str | None = None
    export_dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    progress: bool | None = None
    trackers: str = ""
    fresh: bool = False
    resume_from: str | None = None
    compile_cache: bool | None = None  # None: DEW_COMPILE_CACHE decides, else on
    compile_cache_dir: str | None = None  # dew.compile_cache.configure's directory

    def __post_init__(self) -> None:
        from dew.trainer.tracker import TRACKERS

        if self.fresh and self.resume_from is not None:
            raise ConfigError("run.fresh: starts over, while run.resume_from continues; pass one")
        for name in self.tracker_names():
            if name not in TRACKERS:
                raise ConfigError(
                    f"run.trackers: expected names from {', '.join(TRACKERS)} separated by "
                    f"commas, got {name!r}"
                )
        for name in ("steps", "batch", "microbatches", "log_every", "eval_every",
                     "checkpoint_every", "keep"):  # fmt: skip
            positive(getattr(self, name), f"run.{name}")
        directory_path(self.run_dir, "run.run_dir")
        for key in ("export", "compile_cache_dir"):
            if getattr(self, key):
                directory_path(getattr(self, key), f"run.{key}")
        if self.batch % self.microbatches:
            raise ConfigError(
                f"run.microbatches: {self.microbatches} does not divide run.batch {self.batch}"
            )

    def tracker_names(self) -> list[str]:
        """``trackers`` as a list (``"wandb,mlflow"`` -> ``["wandb", "mlflow"]``)."""
        return [name.strip() for name in self.trackers.split(",") if name.strip()]


@dataclasses.dataclass(frozen=True)
class LMData:
    """A flat token file (``.npy`` or raw ids of ``token_dtype``); ``seq_len`` ids predicted."""

    tokens: str
    seq_len: int = 256
    token_dtype: Literal["uint8", "uint16", "int32", "uint32", "int64"] = "uint16"
    eos_id: int | None = None
    val_tokens: str | None = None
    val_batches: int | None = None

    def __post_init__(self) -> None:
        positive(self.seq_len, "data.seq_len")
        positive(self.eos_id, "data.eos_id", allow_zero=True)
        positive(self.val_batches, "data.val_batches")


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Conversations (``.jsonl``, ``.parquet`` or a Hub id) and a tokenizer with a template."""

    path: str
    tokenizer: str
    seq_len: int = 256
    column: str = "messages"
    val_path: str | None = None

    def __post_init__(self) -> None:
        positive(self.seq_len, "data.seq_len")


@dataclasses.dataclass(frozen=True)
class DPOData:
    """Preference pairs; ``seq_len`` is the whole row width S (prompt and completion)."""

    path: str
    seq_len: int = 256
    tokenizer: str | None = None
    val_path: str | None = None

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ConfigError(f"data.seq_len: expected an integer >= 2, got {self.seq_len!r}")


@dataclasses.dataclass(frozen=True)
class GRPOData:
    """Prompts with ``ground_truth``; ``max_prompt_len`` is the prompt width P."""

    path: str
    max_prompt_len: int = 64
    tokenizer: str | None = None
    val_path: str | None = None

    def __post_init__(self) -> None:
        positive(self.max_prompt_len, "data.max_prompt_len")


@dataclasses.dataclass(frozen=True)
class LMObjectiveConfig:
    """``ema_decay``: keep a moving average of the weights; ``all_tokens`` (SFT): count every
    token in the loss, not only the assistant's; ``name`` (LM), ``noise_schedule``,
    ``mask_id``, ``real_tokens``, ``block_size``, ``mask_rate_min``, ``mask_rate_max``: the
    loss and its diffusion keys
    (``dew.recipes.diffusion_config``)."""

    ema_decay: float | None = None
    all_tokens: bool = False
    name: Literal["next_token", "masked_diffusion", "block_diffusion"] = "next_token"
    noise_schedule: Literal["loglinear", "cosine"] = "loglinear"
    mask_id: int | None = None
    real_tokens: int | None = None
    block_size: int | None = None
    mask_rate_min: float = 1e-3
    mask_rate_max: float = 1.0

    def __post_init__(self) -> None:
        check_diffusion(self)
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(
                f"objective.ema_decay: expected a number in (0, 1), got {self.ema_decay!r}"
            )


@dataclasses.dataclass(frozen=True)
class DPOObjectiveConfig:
    """``beta``: the preference scale; ``nll_weight``: RPO's weight of the chosen answers'
    token-mean NLL (0: plain DPO)."""

    beta: float = 0.1
    nll_weight: float = 0.0

    def __post_init__(self) -> None:
        positive(self.beta, "objective.beta")
        positive(self.nll_weight, "objective.nll_weight", allow_zero=True)


@dataclasses.dataclass(frozen=True)
class GRPOObjectiveConfig(GRPOLoss, RewardShapingOptions):
    """The rollout and loss of GRPO: ``reward`` is ``math``, ``code`` (``dew-sandbox``'s fleet,
    set up by ``reward_args``) or ``module:object`` (a class is made with ``reward_args`` as
    keyword arguments), ``groups`` samples per prompt, ``beta`` the KL coefficient, ``estimator``
    the advantage estimator (``group``, ``mean`` or ``rloo``); the loss keys (``policy_loss``,
    ``aggregation``, ``epsilon_low``, ``epsilon_high``, ``dual_clip``, ``behavior_importance``,
    ``sequence_mask``, ``geometric_mask``, ``kl_estimator``, ``entropy_coeff``,
    ``loss_scale_factor``) are
    ``dew.recipes.stages.GRPOLoss``'s, the reward-shaping keys
    ``dew.recipes.shaping_config.RewardShapingOptions``'s."""

    reward: str = "math"
    reward_args: Any = None
    groups: int = 4
    max_new_tokens: int = 16
    beta: float = 0.0
    temperature: float = 1.0
    top_k: int | None = None
    eos_id: int | None = None
    estimator: Literal["group", "mean", "rloo"] = "group"

    def __post_init__(self) -> None:
        if self.groups < 2:
            raise ConfigError(
                f"objective.groups: expected an integer >= 2 (a group of one has no baseline), "
                f"got {self.groups!r}"
            )
        positive(self.max_new_tokens, "objective.max_new_tokens")
        positive(self.beta, "objective.beta", allow_zero=True)
        positive(self.temperature, "objective.temperature")
        positive(self.top_k, "objective.top_k")
        positive(self.eos_id, "objective.eos_id", allow_zero=True)
        self.check_loss(lambda key: f"objective.{key}")
        given = {**self.shaping_options(), "behavior_importance": self.behavior_importance}
        shaping_parts(given, lambda key: f"objective.{key}", self.max_new_tokens)


DATA = {"lm": LMData, "sft": SFTData, "dpo": DPOData, "grpo": GRPOData, "ppo": GRPOData}
OBJECTIVES = {"lm": LMObjectiveConfig, "sft": LMObjectiveConfig, "dpo": DPOObjectiveConfig,
              "grpo": GRPOObjectiveConfig, "ppo": PPOObjectiveConfig}  # fmt: skip
PATH_KEYS = {"data": ("tokens", "val_tokens", "path", "val_path", "tokenizer"),
             "model": ("pretrained",), "run": ("run_dir", "export")}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A checked ``dew train`` config (see the module docstring)."""

    kind: str
    run: RunConfig
    model: ModelConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    data: Any
    objective: Any
    rollout: RolloutConfig | None = None
    #: None: prompts from ``data``; a ``SourceConfig``: tool episodes; a ``HarborConfig``:
    #: Harbor trials (``data`` is None for both).
    source: SourceConfig | HarborConfig | None = None
    #: None: every weight trains; a ``LoraSection``: an adapter on the frozen base.
    lora: LoraSection | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config as plain nested mappings (what ``RUN_DIR/config.json`` holds); a
        config of prompts has no ``source`` entry."""
        out = dataclasses.asdict(self)
        for name in ("source", "lora"):
            if getattr(self, name) is None:
                del out[name]
        return out


def train_config(mapping: Mapping[str, Any], kind: str) -> TrainConfig:
    """Check ``mapping`` as a config of ``kind`` and return it typed; errors name the key."""
    if kind not in KINDS:
        raise ConfigError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    for key in mapping:
        if key not in SECTIONS:
            raise unknown_key("", str(key), SECTIONS)
    if mapping.get("kind", kind) != kind:
        raise ConfigError(
            f"kind: the config is for {mapping['kind']!r} but the command is 'dew train {kind}'"
        )
    objective = mapping.get("objective") or {}
    if kind in ("lm", "sft") and isinstance(objective, Mapping):
        only = {"all_tokens": "sft", **dict.fromkeys(DIFFUSION_KEYS, "lm")}
        unset = {f.name: f.default for f in dataclasses.fields(LMObjectiveConfig)}
        for key in (k for k in objective if only.get(k, kind) != kind):
            if objective[key] != unset[key]:
                raise ConfigError(f"objective.{key}: only 'dew train {only[key]}' takes it")
    raw = mapping.get("source")
    source: SourceConfig | HarborConfig | None
    if isinstance(raw, Mapping) and raw.get("kind") == "harbor":
        source = harbor_section(mapping, kind)
    else:
        source = source_section(mapping, kind)
    config = TrainConfig(
        kind=kind,
        run=section(RunConfig, mapping.get("run"), "run"),
        model=model_config(mapping.get("model")),
        optimizer=optimizer_config(mapping.get("optimizer")),
        schedule=schedule_config(mapping.get("schedule")),
        data=None if source else section(DATA[kind], mapping.get("data"), "data"),
        objective=section(OBJECTIVES[kind], mapping.get("objective"), "objective"),
        source=source,
        lora=lora_section(mapping.get("lora"), kind),
    )
    config = dataclasses.replace(config, rollout=_rollout(mapping, kind, config.objective))
    problem = None if config.lora is None else lora_rollout_problem(config.rollout, source)
    if problem is not None:
        raise ConfigError(": ".join(problem))
    kept = getattr(config.objective, "dynamic_sampling_groups", None)
    if kept is not None and kept > config.run.batch:
        raise ConfigError(f"objective.dynamic_sampling_groups: expected at most run.batch "
                          f"({config.run.batch}, the prompts drawn per round), got {kept}")  # fmt: skip
    for name in ("data", "model"):
        part = getattr(config, name)
        if part is None:  # no data section: environment episodes
            continue
        changes = {}
        for key in PATH_KEYS[name]:
            value = getattr(part, key, None)
            if isinstance(value, str):
                changes[key] = local_path(value, _cwd(), f"{name}.{key}")
        config = dataclasses.replace(config, **{name: dataclasses.replace(part, **changes)})
    return config


def _rollout(mapping: Mapping[str, Any], kind: str, objective: Any) -> RolloutConfig | None:
    """The ``rollout`` section of an RL kind (every default when left out), else None."""
    if kind not in ASYNC_KINDS:
        if mapping.get("rollout") is not None:
            raise ConfigError(
                f"rollout: only {' and '.join('dew train ' + k for k in ASYNC_KINDS)} take it, "
                f"not 'dew train {kind}'"
            )
        return None
    config = rollout_config(mapping.get("rollout"))
    if config.is_async and config.max_lag and objective.behavior_importance is None:
        raise ConfigError(
            f"objective.behavior_importance: rollout.max_lag {config.max_lag} lets rollouts "
            "train on older weights, which needs a correction: a TIS cap (a number such as "
            "2.0) or an IcePop band [low, high]"
        )
    if config.is_async:  # the scheduler draws the batches: the sampler's shaping never runs
        from dew.recipes.shaping_config import (
            CORRECTION_KEYS,
            DYNAMIC_KEYS,
            KL_KEYS,
            SHAPING_KEYS,
            refuse_shaping,
        )

        # the scheduler measures the correction bounds and filters uniform groups itself;
        # PPO charges the KL in its own rollout, after the scheduler's batch
        keys = tuple(k for k in SHAPING_KEYS if k not in CORRECTION_KEYS + DYNAMIC_KEYS
                     and (kind == "grpo" or k not in KL_KEYS))  # fmt: skip
        refuse_shaping(dataclasses.asdict(objective), lambda k: f"objective.{k}",
                       "rollout.mode async does not apply it; expected mode: sync", keys)  # fmt: skip
        groups = getattr(objective, "dynamic_sampling_groups", None)
        if groups is not None and config.admit is not None:
            raise ConfigError(f"rollout.admit: dynamic sampling admits its own {groups} groups "
                              f"(objective.dynamic_sampling_groups); expected admit unset, got "
                              f"{config.admit}")  # fmt: skip
    return config


def _cwd() -> Any:
    from pathlib import Path

    return Path.cwd()


__all__ = [
    "KINDS",
    "ASYNC_KINDS",
    "RL_KINDS",
    "DPOData",
    "DPOObjectiveConfig",
    "GRPOData",
    "GRPOObjectiveConfig",
    "LMData",
    "LMObjectiveConfig",
    "RunConfig",
    "SFTData",
    "TrainConfig",
    "train_config",
]

"""One builder of the model, the optimizer and the learning-rate schedule from a config.

``dew train``, ``dew chain`` and the quickstart all build through here, so a config means
the same thing in each. Three sections::

    model:     {name: qwen3, emb_features: 256, num_layers: 4, num_heads: 4, ...}
               or {pretrained: path/to/hf-dir}
    optimizer: {name: adamw, learning_rate: 3e-4, weight_decay: 0.01, clip: 1.0}
    schedule:  {kind: cosine, warmup_steps: 100, end_fraction: 0.1}

``build_model(ModelConfig, vocab_size=..., max_seq_len=...)`` returns ``(model, variables)``
(``variables`` None unless ``pretrained``). ``build_schedule(ScheduleConfig, peak, steps)``
returns an optax schedule. ``build_optimizer(OptimizerConfig, ScheduleConfig, steps)`` returns
the optax transformation: an optional global-norm clip, then the optimizer with its learning
rate injected as a hyperparameter, so the Trainer logs the rate of every step.

Schedules (``steps`` is the stage's step count; ``decay_steps`` defaults to it):

* ``constant``: a linear warmup from 0 over ``warmup_steps`` (none when 0), then the peak.
* ``cosine``: the same warmup, then a cosine from the peak down to ``end_fraction * peak`` at
  ``decay_steps``, flat after.
* ``linear``: the same warmup, then a straight line down to ``end_fraction * peak``.

Each section reads from a mapping with ``model_config(mapping)`` and friends
(``dew.recipes.schema.section``): unknown keys are refused naming the nearest valid one, and
values are checked for type and range before anything is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from dew.checks import is_int
from dew.recipes.schema import ConfigError, positive, section

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The decoder: a named family with its sizes, or a Hugging Face directory.

    ``vocab_size`` and ``max_seq_len`` default to what the data needs (the caller passes
    them); ``mlp_features`` to four times ``emb_features``; ``num_kv_heads`` to ``num_heads``.
    With ``pretrained`` every size key is ignored and the directory's config is used.
    ``remat`` is the decoder layers' gradient checkpointing (``dew.models.remat``: ``none``,
    ``full``, ``dots_saveable``, ``dots_with_no_batch_dims_saveable``), fresh or pretrained;
    ``scan_layers`` runs the layers as one ``jax.lax.scan`` (``dew.models.scan``: one
    compiled layer body, the same weights), fresh or pretrained.
    """

    name: str = "qwen3"
    vocab_size: int | None = None
    emb_features: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    mlp_features: int | None = None
    max_seq_len: int | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    pretrained: str | None = None
    remat: Literal["none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"] = "none"
    scan_layers: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "emb_features", "num_layers", "num_heads", "num_kv_heads",
                     "mlp_features", "max_seq_len"):  # fmt: skip
            positive(getattr(self, name), f"model.{name}")
        from dew.models import families

        if self.pretrained is None and self.name not in families():
            raise ConfigError(
                f"model.name: expected one of {', '.join(families())}, got {self.name!r}"
            )


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer: ``adam``, ``adamw`` or ``sgd`` with a peak learning rate.

    ``weight_decay`` applies to ``adamw`` only (default 0.01; ``adam`` and ``sgd`` refuse a
    non-zero one);
    ``clip`` is the global gradient-norm limit (0 disables it); ``momentum`` is for ``sgd``.
    """

    name: Literal["adam", "adamw", "sgd"] = "adamw"
    learning_rate: float = 3e-4
    weight_decay: float | None = None
    clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float | None = None

    def __post_init__(self) -> None:
        positive(self.learning_rate, "optimizer.learning_rate")
        positive(self.weight_decay, "optimizer.weight_decay", allow_zero=True)
        positive(self.clip, "optimizer.clip", allow_zero=True)
        positive(self.eps, "optimizer.eps")
        positive(self.momentum, "optimizer.momentum", allow_zero=True)
        for name in ("b1", "b2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"optimizer.{name}: expected a number in [0, 1), got {value!r}")
        if self.name != "adamw" and self.weight_decay not in (None, 0.0):
            raise ConfigError(
                f"optimizer.weight_decay: only adamw decays weights; got {self.weight_decay!r} "
                f"with optimizer.name={self.name!r}"
            )
        if self.name != "sgd" and self.momentum is not None:
            raise ConfigError(
                f"optimizer.momentum: only sgd takes a momentum; got {self.momentum!r} with "
                f"optimizer.name={self.name!r}"
            )


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate schedule around the optimizer's peak (see the module docstring)."""

    kind: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    end_fraction: float = 0.1
    decay_steps: int | None = None

    def __post_init__(self) -> None:
        positive(self.warmup_steps, "schedule.warmup_steps", allow_zero=True)
        positive(self.decay_steps, "schedule.decay_steps")
        if not 0.0 <= self.end_fraction <= 1.0:
            raise ConfigError(
                f"schedule.end_fraction: expected a number in [0, 1], got {self.end_fraction!r}"
            )


def model_config(mapping: Any, where: str = "model") -> ModelConfig:
    """``ModelConfig`` from a mapping (unknown keys refused with the nearest valid one)."""
    return section(ModelConfig, mapping, where)


def optimizer_config(mapping: Any, where: str = "optimizer") -> OptimizerConfig:
    """``OptimizerConfig`` from a mapping."""
    return section(OptimizerConfig, mapping, where)


def schedule_config(mapping: Any, where: str = "schedule") -> ScheduleConfig:
    """``ScheduleConfig`` from a mapping."""
    return section(ScheduleConfig, mapping, where)


def pretrained_directory(name: str) -> str:
    """The local directory of ``model.pretrained``: ``name`` itself, or, for a Hub id
    (``org/name``), its snapshot in the Hugging Face cache (downloaded when the network
    allows; with ``HF_HUB_OFFLINE=1`` or no network, only what the cache holds)."""
    from dew.data.chat.template import local_or_hub_directory

    patterns = ("config.json", "*.safetensors", "*.safetensors.index.json")
    failed = ", and the Hugging Face cache does not hold it either"
    return local_or_hub_directory(name, "model.pretrained", "model", patterns, failed)


def build_model(
    config: ModelConfig,
    *,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    length_from: str | None = None,
) -> tuple[Any, Any]:
    """``(model, variables)``: a fresh decoder (``variables`` None) or a pretrained one.

    ``vocab_size`` and ``max_seq_len`` are what the data needs: they fill the config's unset
    sizes, and a model whose vocabulary or positions are fewer is refused. ``length_from``
    says where ``max_seq_len`` comes from (the options to change), for that error.
    """
    source = f"the rows the data makes ({max_seq_len})" if length_from is None else length_from
    from dew import models

    if config.pretrained is not None:
        loaded = models.load_pretrained(pretrained_directory(config.pretrained), dtype=config.dtype)
        if vocab_size is not None and loaded.config.vocab_size < vocab_size:
            raise ConfigError(
                f"model.pretrained: the model's vocabulary ({loaded.config.vocab_size}) is "
                f"smaller than the data's ({vocab_size})"
            )
        positions = getattr(loaded.config, "max_seq_len", None)
        if max_seq_len is not None and positions is not None and positions < max_seq_len:
            raise ConfigError(
                f"model.pretrained: the model covers {positions} positions, fewer than {source}"
            )
        model = loaded.model
        if config.remat != "none" or config.scan_layers:  # the same weights, run otherwise
            changes = {"remat": config.remat, "scan_layers": config.scan_layers}
            model = type(model)(model.config.replace(**changes))
        return model, dict(loaded.variables)
    vocab = config.vocab_size if config.vocab_size is not None else vocab_size
    if vocab is None:
        raise ConfigError("model.vocab_size: required when the data does not give it")
    if vocab_size is not None and vocab < vocab_size:
        raise ConfigError(
            f"model.vocab_size: {vocab} is smaller than the data's vocabulary ({vocab_size})"
        )
    width = config.max_seq_len if config.max_seq_len is not None else max_seq_len
    options: dict[str, Any] = {}
    if width is not None:
        if max_seq_len is not None and width < max_seq_len:
            raise ConfigError(f"model.max_seq_len: {width} is shorter than {source}")
        options["max_seq_len"] = width
    model = models.build(
        config.name,
        vocab_size=vocab,
        emb_features=config.emb_features,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        mlp_features=config.mlp_features or 4 * config.emb_features,
        dtype=config.dtype,
        remat=config.remat,
        scan_layers=config.scan_layers,
        **options,
    )
    return model, None


def build_schedule(config: ScheduleConfig, peak: float, steps: int) -> Any:
    """The optax schedule of ``config`` for ``steps`` steps peaking at ``peak``."""
    import optax

    if not is_int(steps) or steps < 1:
        raise ConfigError(f"steps: expected a positive integer, got {steps!r}")
    warmup = config.warmup_steps
    decay = config.decay_steps if config.decay_steps is not None else steps
    end = peak * config.end_fraction
    if config.kind != "constant" and decay <= warmup:
        raise ConfigError(
            f"schedule.warmup_steps: {warmup} leaves no steps to decay over "
            f"(decay_steps {decay}); expected fewer warmup steps"
        )
    if config.kind == "constant":
        if warmup == 0:
            return optax.constant_schedule(peak)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup]
        )
    if config.kind == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, decay, end_value=end)
    tail = optax.linear_schedule(peak, end, decay - warmup)
    if warmup == 0:
        return tail
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), tail], [warmup])


def build_optimizer(
    config: OptimizerConfig, schedule: ScheduleConfig | None = None, *, steps: int
) -> Any:
    """The optax transformation: clip (unless 0), then the optimizer on the scheduled rate."""
    import optax

    rate = build_schedule(schedule or ScheduleConfig(), config.learning_rate, steps)
    if config.name == "adamw":
        inner = optax.inject_hyperparams(optax.adamw)(
            learning_rate=rate,
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=0.01 if config.weight_decay is None else config.weight_decay,
        )
    elif config.name == "adam":
        inner = optax.inject_hyperparams(optax.adam)(
            learning_rate=rate, b1=config.b1, b2=config.b2, eps=config.eps
        )
    else:
        inner = optax.inject_hyperparams(optax.sgd)(learning_rate=rate, momentum=config.momentum)
    if config.clip > 0:
        return optax.chain(optax.clip_by_global_norm(config.clip), inner)
    return inner


__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "build_model",
    "build_optimizer",
    "build_schedule",
    "model_config",
    "optimizer_config",
    "schedule_config",
]

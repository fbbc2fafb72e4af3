"""The config of ``dew train flow`` (alias ``flow-grpo``): its sections and their checks.

A config has the sections of every ``dew train`` kind, with Flow-GRPO's keys::

    kind: flow
    run:       {run_dir: runs/flow, steps: 20, batch: 4, seed: 0, log_every: 1,
                checkpoint_every: 10, keep: 3, progress: null}            FlowRunConfig
    model:     {preset: flow, emb_features: 32, num_layers: 1, num_heads: 2,
                patch_size: 4, mlp_ratio: 2.0, shift: 1.0}                FlowModelConfig
    optimizer: {name: adam, learning_rate: 1e-3}       dew.recipes.builder.OptimizerConfig
    schedule:  {kind: constant}                        dew.recipes.builder.ScheduleConfig
    data:      {labels: [0, 1, 2, 3]}                                     FlowData
    objective: {reward: colour, colour: red, groups: 4, steps: 6, noise_level: 0.7,
                beta: 0.0, epsilon_low: 1e-4, epsilon_high: 1e-4, ...}    FlowObjectiveConfig

The model is a ``SimpleDiT`` with a ``LabelEncoder`` on the ``[16, 16, 3]`` images of
``dew.flow.shapes``, its process built by the preset (``dew.flow.presets``) named by
``model.preset``; the data are the shape labels the rollout conditions on. ``flow_config``
checks every key and value before anything is built and raises ``ConfigError`` naming it
(``objective.groups: expected an integer >= 2 ...``, an unknown key with the valid ones).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dew.checks import is_int
from dew.flow import presets, shapes
from dew.recipes.builder import (
    OptimizerConfig,
    ScheduleConfig,
    optimizer_config,
    schedule_config,
)
from dew.recipes.schema import ConfigError, directory_path, positive, section, unknown_key

__all__ = [
    "KINDS",
    "PRESETS",
    "FlowConfig",
    "FlowData",
    "FlowModelConfig",
    "FlowObjectiveConfig",
    "FlowRunConfig",
    "flow_config",
    "flow_reward",
]

#: The kind's names on the command line (``dew train flow`` or ``dew train flow-grpo``).
KINDS = ("flow", "flow-grpo")
#: ``model.preset`` names: the process presets of ``dew.flow.presets``.
PRESETS = {"flow": presets.Flow}
_SECTIONS = ("kind", "run", "model", "optimizer", "schedule", "data", "objective")


@dataclasses.dataclass(frozen=True)
class FlowRunConfig:
    """Where and how long: ``batch`` condition rows per step (each sampled ``groups`` times),
    a checkpoint every ``checkpoint_every`` steps (``keep`` of them) in ``run_dir``."""

    run_dir: str
    steps: int
    batch: int = 4
    seed: int = 0
    log_every: int = 1
    checkpoint_every: int = 100
    keep: int = 3
    progress: bool | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "log_every", "checkpoint_every", "keep"):
            positive(getattr(self, name), f"run.{name}")
        directory_path(self.run_dir, "run.run_dir")


@dataclasses.dataclass(frozen=True)
class FlowModelConfig:
    """The process preset (``PRESETS``) and the ``SimpleDiT``'s sizes; ``shift`` is the
    preset's time shift."""

    preset: str = "flow"
    emb_features: int = 32
    num_layers: int = 1
    num_heads: int = 2
    patch_size: int = 4
    mlp_ratio: float = 2.0
    shift: float = 1.0

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(
                f"model.preset: expected one of {', '.join(PRESETS)}, got {self.preset!r}"
            )
        for name in ("emb_features", "num_layers", "num_heads", "patch_size", "mlp_ratio",
                     "shift"):  # fmt: skip
            positive(getattr(self, name), f"model.{name}")
        if self.emb_features % self.num_heads:
            raise ConfigError(
                f"model.num_heads: {self.num_heads} does not divide model.emb_features "
                f"{self.emb_features}"
            )
        if shapes.SIZE % self.patch_size:
            raise ConfigError(
                f"model.patch_size: expected a divisor of the image size {shapes.SIZE}, "
                f"got {self.patch_size}"
            )


@dataclasses.dataclass(frozen=True)
class FlowData:
    """The conditions rolled out: shape labels of ``dew.flow.shapes`` (``0`` to
    ``LABELS - 1``), drawn uniformly for each row of each step."""

    labels: Any = (0, 1, 2, 3)

    def __post_init__(self) -> None:
        labels = self.labels
        if not isinstance(labels, list | tuple) or not labels:
            raise ConfigError(f"data.labels: expected a non-empty list of labels, got {labels!r}")
        for i, label in enumerate(labels):
            if not is_int(label) or not 0 <= label < shapes.LABELS:
                raise ConfigError(
                    f"data.labels[{i}]: expected a shape label 0..{shapes.LABELS - 1}, "
                    f"got {label!r}"
                )
        object.__setattr__(self, "labels", tuple(int(x) for x in labels))


@dataclasses.dataclass(frozen=True)
class FlowObjectiveConfig:
    """Flow-GRPO's options (``FlowGRPOObjective`` and ``FlowRollout``).

    ``reward`` is ``colour`` (the quickstart's share of ``colour`` pixels, ``red``, ``green``
    or ``blue``) or ``module:object``, a ``reward(images [N, H, W, C] in [-1, 1], batch) ->
    [N]`` callable; ``groups`` samples per row; ``steps`` sampler time points (both ends, so
    ``steps - 1`` SDE steps); ``train_steps`` how many stochastic transitions enter the loss
    (null: all); ``noise_level`` the SDE's noise; ``beta`` the KL weight to the starting
    policy; ``epsilon_low``/``epsilon_high`` the ratio clip; ``advantage_clip`` the bound of
    the advantages (null: none); ``guidance`` a classifier-free guidance scale (null: none).
    """

    reward: str = "colour"
    colour: str = "red"
    groups: int = 4
    steps: int = 6
    train_steps: int | None = None
    noise_level: float = 0.7
    beta: float = 0.0
    epsilon_low: float = 1e-4
    epsilon_high: float = 1e-4
    advantage_clip: float | None = 5.0
    guidance: float | None = None

    def __post_init__(self) -> None:
        if self.groups < 2:
            raise ConfigError(
                f"objective.groups: expected an integer >= 2 (a group of one has no baseline), "
                f"got {self.groups}"
            )
        if self.steps < 2:
            raise ConfigError(
                f"objective.steps: expected an integer >= 2 (both ends), got {self.steps}"
            )
        positive(self.train_steps, "objective.train_steps")
        positive(self.noise_level, "objective.noise_level")
        positive(self.beta, "objective.beta", allow_zero=True)
        positive(self.epsilon_low, "objective.epsilon_low")
        positive(self.epsilon_high, "objective.epsilon_high")
        positive(self.advantage_clip, "objective.advantage_clip")
        if self.colour not in shapes.COLOURS:
            raise ConfigError(
                f"objective.colour: expected one of {', '.join(shapes.COLOURS)}, "
                f"got {self.colour!r}"
            )


@dataclasses.dataclass(frozen=True)
class FlowConfig:
    """A checked ``dew train flow`` config."""

    run: FlowRunConfig
    model: FlowModelConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    data: FlowData
    objective: FlowObjectiveConfig

    def as_dict(self) -> dict[str, Any]:
        """Plain nested mappings (what ``RUN_DIR/config.json`` holds), with ``kind: flow``."""
        return {"kind": "flow", **dataclasses.asdict(self)}


def flow_config(mapping: Mapping[str, Any]) -> FlowConfig:
    """Check ``mapping`` (sections as in the module docstring) and return it typed, the
    reward loaded once to be sure it can be; every error is one ``ConfigError`` line."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"config: expected a mapping of sections, got {mapping!r}")
    for key in mapping:
        if key not in _SECTIONS:
            raise unknown_key("", str(key), _SECTIONS)
    kind = mapping.get("kind", "flow")
    if kind not in KINDS:
        raise ConfigError(f"kind: the config is for {kind!r} but the command is 'dew train flow'")
    config = FlowConfig(
        run=section(FlowRunConfig, mapping.get("run"), "run"),
        model=section(FlowModelConfig, mapping.get("model"), "model"),
        optimizer=optimizer_config(mapping.get("optimizer")),
        schedule=schedule_config(mapping.get("schedule")),
        data=section(FlowData, mapping.get("data"), "data"),
        objective=section(FlowObjectiveConfig, mapping.get("objective"), "objective"),
    )
    flow_reward(config.objective)
    return config


def flow_reward(objective: FlowObjectiveConfig) -> Callable[..., Any]:
    """The ``reward(images, batch) -> [N]`` that ``objective.reward`` names; a ``module``
    is imported with the working directory on ``sys.path``."""
    spec = objective.reward
    if spec == "colour":
        colour = objective.colour

        def colour_reward(images: Any, batch: Any) -> Any:
            return shapes.colour_fraction(images, colour)

        return colour_reward
    if spec.count(":") != 1:
        raise ConfigError(f"objective.reward: expected 'colour' or 'module:object', got {spec!r}")
    module, name = spec.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ConfigError(f"objective.reward: cannot import module {module!r} ({err})") from None
    except AttributeError:
        raise ConfigError(
            f"objective.reward: module {module!r} has no attribute {name!r}"
        ) from None
    if not callable(fn):
        raise ConfigError(f"objective.reward: {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]

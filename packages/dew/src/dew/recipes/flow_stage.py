"""A ``dew chain`` stage of kind ``flow`` (alias ``flow-grpo``): Flow-GRPO, trained by ``dew-flow``.

A flow stage runs exactly what ``dew train flow`` runs (``dew.recipes.flow_cli``): ``dew``
loads ``dew-flow``'s trainer by the entry point ``flow`` of the group ``dew.recipes`` and
hands it a ``dew train flow`` config. The stage gives that config's sections other than
``run`` (``model``, ``data``, ``objective``, ``optimizer``, ``schedule``); the chain fills
``run``: ``run_dir`` is the stage's directory, ``steps`` the stage's, ``batch`` the chain's,
``seed`` drawn from the chain's key and the stage's position. A stage directory that holds
checkpoints resumes from the newest one; a finished one restores without training.

The image model of a flow stage is its own (``dew-flow``'s ``SimpleDiT``): it neither starts
from the text stages' decoder nor hands its parameters to the next stage, so a chain may
hold flow stages alone or between text stages, and those text stages chain past it.

``flow_stage`` reads one from a ``dew chain`` config and checks it before any stage trains,
through ``dew-flow``'s ``flow_config`` (the entry point ``flow_config``); without
``dew-flow`` installed it is a one-line error naming the stage's ``kind`` and what to install.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dew.checks import is_int
from dew.recipes.flow_cli import FLOW_KINDS
from dew.recipes.plugins import load_plugin
from dew.recipes.schema import ConfigError, unknown_key

#: The ``dew train flow`` sections a flow stage gives (the chain fills ``run``).
FLOW_SECTIONS = ("model", "data", "objective", "optimizer", "schedule")
_KEYS = ("name", "kind", "steps", *FLOW_SECTIONS)


@dataclass(frozen=True)
class FlowStage:
    """One Flow-GRPO stage of a ``dew.recipes.Recipe``.

    Attributes:
      name: directory name under ``Recipe.output`` (distinct per stage).
      steps: optimizer steps of this stage.
      config: the ``dew train flow`` sections other than ``run`` (``FLOW_SECTIONS``), as
        plain mappings; ``dew-flow`` checks their keys and values.
      kind: ``"flow"`` or its alias ``"flow-grpo"``.
    """

    name: str
    steps: int
    config: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "flow"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or os.sep in self.name or (
                self.name in (".", "..")):  # fmt: skip
            raise ValueError(f"Stage.name: expected a plain directory name, got {self.name!r}")
        if not is_int(self.steps) or self.steps < 1:
            raise ValueError(f"Stage.steps ({self.name}): expected a positive int, got "
                             f"{self.steps!r}")  # fmt: skip
        if self.kind not in FLOW_KINDS:
            raise ValueError(f"Stage.kind ({self.name}): expected one of "
                             f"{', '.join(FLOW_KINDS)}, got {self.kind!r}")  # fmt: skip
        if not isinstance(self.config, Mapping):
            raise TypeError(f"Stage.config ({self.name}): expected a mapping of sections, got "
                            f"{type(self.config).__name__}")  # fmt: skip
        for key in self.config:
            if key not in FLOW_SECTIONS:
                raise ValueError(f"Stage.config ({self.name}): expected the sections "
                                 f"{', '.join(FLOW_SECTIONS)}, got {key!r}")  # fmt: skip

    def mapping(self, run_dir: str | os.PathLike[str], *, batch: int, seed: int,
                log_every: int | None = None, progress: bool | None = None,
                checkpoint_every: int | None = None) -> dict[str, Any]:  # fmt: skip
        """The ``dew train flow`` config of this stage trained in ``run_dir``; the ``run``
        keys left None keep ``dew-flow``'s defaults."""
        run = {"run_dir": os.fspath(run_dir), "steps": self.steps, "batch": batch, "seed": seed,
               "log_every": log_every, "progress": progress,
               "checkpoint_every": checkpoint_every}  # fmt: skip
        run = {k: v for k, v in run.items() if v is not None or k == "progress"}
        return {"kind": "flow", **copy.deepcopy(dict(self.config)), "run": run}

    def train(self, run_dir: str | os.PathLike[str], **run: Any) -> Any:
        """Train (or resume, or restore) this stage in ``run_dir`` with ``dew-flow``'s trainer;
        ``run`` are ``mapping``'s keywords. Returns the final ``TrainState``."""
        trainer = load_plugin("flow", f"Stage.kind ({self.name})", "dew-flow")
        return trainer(self.mapping(run_dir, **run))


def flow_stage(
    spec: Mapping[str, Any], where: str, config: Mapping[str, Any], output: Path, batch: int
) -> FlowStage:
    """The checked flow stage ``spec`` of a ``dew chain`` config at ``where`` (``stages.<i>``):
    its ``optimizer`` and ``schedule`` merged over the config's top-level ones, the whole
    ``dew train flow`` config it makes checked by ``dew-flow`` with every error naming its
    key under ``where``. ``output`` is the chain's run directory."""
    if "from" in spec:
        raise ConfigError(f"{where}.from: a {spec.get('kind')} stage trains its own image model "
                          "and takes no start from another stage")  # fmt: skip
    for key in spec:
        if key not in _KEYS:
            raise unknown_key(where, str(key), _KEYS)
    sections: dict[str, Any] = {}
    for key in FLOW_SECTIONS:
        top = config.get(key) if key in ("optimizer", "schedule") else None
        given = spec.get(key)
        for value, name in ((top, key), (given, f"{where}.{key}")):
            if value is not None and not isinstance(value, Mapping):
                raise ConfigError(f"{name}: expected a mapping of keys, got {value!r}")
        if top is not None or given is not None:
            sections[key] = {**(top or {}), **(given or {})}
    try:
        stage = FlowStage(name=spec["name"], steps=spec["steps"], config=sections,
                          kind=spec["kind"])  # fmt: skip
    except KeyError as err:
        raise ConfigError(f"{where}.{err.args[0]}: required, missing") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    check = load_plugin("flow_config", f"{where}.kind", "dew-flow")
    try:
        check(stage.mapping(output / stage.name, batch=batch, seed=0))
    except ConfigError as err:
        raise ConfigError(f"{where}.{err}") from None
    return stage


__all__ = ["FLOW_SECTIONS", "FlowStage", "flow_stage"]

"""One stage of a ``dew chain`` config: its keys checked, its dataset, reward and optimizer.

``chain_stage(config, spec, where, at, valid, stack)`` turns the stage mapping ``spec`` (at
config key ``where``, ``stages.N``) into a ``dew.recipes.chain.Stage`` and the optimizer
built for its steps (a ``FlowStage`` and None for a flow stage, which builds its own).
``data.type`` names the dataset class, whose keyword arguments are the other ``data`` keys
(``stage_dataset``); a stage's ``optimizer`` and ``schedule`` keys are merged over the
top-level ones. Every error is a ``ConfigError`` naming the key (``stages.1.data.path``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dew.checks import is_int
from dew.recipes.chain_lora import stage_lora
from dew.recipes.references import local_path, make_reward
from dew.recipes.schema import ConfigError, check_value, unknown_key

DATASETS = ("ChatMessages", "PreferencePairs", "Prompts", "TokenFile")
_PATH_KEYS = ("path", "tokenizer", "val_path")


def stage_dataset(spec: Any, base: Path, where: str) -> Any:
    from dew.data.chat import ChatMessages
    from dew.data.preference import PreferencePairs
    from dew.data.prompts import Prompts
    from dew.data.tokens import TokenFile

    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'type' of {', '.join(DATASETS)}")
    kind = spec["type"]
    classes = {"ChatMessages": ChatMessages, "PreferencePairs": PreferencePairs,
               "Prompts": Prompts, "TokenFile": TokenFile}  # fmt: skip
    if kind not in classes:
        raise ConfigError(f"{where}.type: expected one of {', '.join(DATASETS)}, got {kind!r}")
    accepted = [
        name for name in inspect.signature(classes[kind]).parameters if name not in ("self",)
    ]
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    for key in kwargs:
        if key not in accepted:
            raise unknown_key(where, key, accepted)
    for key in _PATH_KEYS:
        if key in kwargs:
            kwargs[key] = local_path(kwargs[key], base, f"{where}.{key}")
    if isinstance(kwargs.get("records"), list):
        kwargs["records"] = tuple(
            r if isinstance(r, str) else json.dumps(r) for r in kwargs["records"]
        )
    try:
        return classes[kind](**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


def _merge(base: Any, over: Any, where: str) -> dict[str, Any]:
    for value, name in ((base, where.rsplit(".", 1)[-1]), (over, where)):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping of keys, got {value!r}")
    return {**(base or {}), **(over or {})}


def stage_keys() -> list[str]:
    import dataclasses

    from dew.recipes.chain import Stage

    fields = [f.name for f in dataclasses.fields(Stage) if f.name != "decode"]
    return fields + ["reward_args", "optimizer", "schedule"]


def _check_loss(spec: dict[str, Any], where: str) -> None:
    """Type a stage's GRPO loss keys as ``dew train grpo``'s objective keys (in place) and
    check them as ``GRPOObjective`` would (names against ``dew.rl``'s registries), each
    error naming ``where.key``."""
    import typing

    from dew.recipes.stages import LOSS_KEYS, GRPOLoss

    hints = typing.get_type_hints(GRPOLoss)
    given = [key for key in LOSS_KEYS if key in spec]
    for key in given:
        spec[key] = check_value(spec[key], hints[key], f"{where}.{key}")
    if given:
        GRPOLoss(**{key: spec[key] for key in given}).check_loss(lambda key: f"{where}.{key}")


def chain_stage(config: Mapping[str, Any], spec: Any, where: str, at: tuple[Path, Path, int],
           valid: Sequence[str], stack: contextlib.ExitStack | None) -> tuple[Any, Any]:  # fmt: skip
    """One checked stage of the config and the optimizer built for its steps (None for a
    flow stage, which builds its own); ``at`` is the config's directory, the output and the
    batch."""
    from dew.recipes.builder import build_optimizer, optimizer_config, schedule_config
    from dew.recipes.chain import Stage
    from dew.recipes.flow_cli import FLOW_KINDS
    from dew.recipes.source_config import stage_source

    base, output, batch = at
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {spec!r}")
    spec = dict(spec)
    steps = spec.get("steps")
    if not is_int(steps) or steps < 1:
        raise ConfigError(f"{where}.steps: expected a positive integer, got {steps!r}")
    if spec.get("kind") in FLOW_KINDS:  # dew-flow's Flow-GRPO (dew.recipes.flow_stage)
        from dew.recipes.flow_stage import flow_stage

        return flow_stage(spec, where, config, output, batch), None
    for key in spec:
        if key not in valid:
            raise unknown_key(where, str(key), valid)
    spec["lora"] = stage_lora(config, spec, where)  # dew.recipes.chain_lora
    source = stage_source(spec, where, base)  # tool episodes instead of data
    if source is not None:
        from dew.recipes.environment_run import episode_source

        episode_source(source, f"{where}.source")  # the worker's keys and the verifier
    opt = optimizer_config(
        _merge(config.get("optimizer"), spec.pop("optimizer", None), f"{where}.optimizer"),
        f"{where}.optimizer",
    )
    sched = schedule_config(
        _merge(config.get("schedule"), spec.pop("schedule", None), f"{where}.schedule"),
        f"{where}.schedule",
    )
    data_spec = spec.pop("data", None)
    data = None if source is not None else stage_dataset(data_spec, base, f"{where}.data")
    spec["source"] = source
    _check_loss(spec, where)
    if spec.get("rollout") is not None:
        from dew.recipes.async_run import stage_rollout

        spec["rollout"] = stage_rollout(spec, data, where)
    reward, reward_args = spec.pop("reward", None), spec.pop("reward_args", None)
    if reward is not None:
        reward = make_reward(reward, f"{where}.reward", reward_args, stack)
    elif reward_args is not None:
        raise ConfigError(f"{where}.reward_args: given without a reward")
    decode = _decoder(data, data_spec, base, f"{where}.data") if reward is not None else None
    try:
        stage = Stage(data=data, reward=reward, decode=decode, **spec)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    return stage, build_optimizer(opt, sched, steps=stage.steps)


def _decoder(data: Any, spec: Any, base: Path, where: str) -> Any:
    """The text of sampled ids for a GRPO stage's reward: the ``decode`` of the tokenizer its
    prompts were given (``data.tokenizer``), or None without one (the reward then reads the
    ids as text, separated by spaces)."""
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer is None and isinstance(spec, Mapping) and spec.get("tokenizer") is not None:
        from dew.data.prompts import resolve_tokenizer

        path = local_path(spec["tokenizer"], base, f"{where}.tokenizer")
        try:
            tokenizer = resolve_tokenizer(path)
        except (OSError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}.tokenizer: {err}") from None
    return None if tokenizer is None else tokenizer.decode


__all__ = ["DATASETS", "chain_stage", "stage_dataset", "stage_keys"]

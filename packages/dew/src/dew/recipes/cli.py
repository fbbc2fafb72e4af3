"""``dew chain CONFIG``: run a ``Recipe`` described by a JSON file.

The config (paths inside it are relative to the config file's directory)::

    {
      "output": "runs/chain",            # run directory; one sub-directory per stage
      "batch": 8,                        # rows (GRPO: prompts) per step
      "seed": 0,
      "model": {"name": "causal_transformer", "vocab_size": 64, "emb_features": 32,
                "num_layers": 2, "num_heads": 2, "mlp_features": 64, "max_seq_len": 64},
      "pretrained": "hf-model-dir",      # optional: a Hugging Face directory to start from
      "optimizer": {"name": "adamw", "learning_rate": 1e-4},   # any optax.<name>(**kwargs)
      "log_every": 10,
      "stages": [
        {"name": "sft", "steps": 100,
         "data": {"type": "ChatMessages", "path": "chat.jsonl", "tokenizer": "tok", "seq_len": 63}},
        {"name": "dpo", "steps": 50, "beta": 0.1,
         "data": {"type": "PreferencePairs", "path": "pairs.parquet", "seq_len": 64}},
        {"name": "grpo", "steps": 20, "beta": 0.01, "reward": "my_rewards:exact",
         "groups": 4, "max_new_tokens": 16, "sample": 40,
         "data": {"type": "Prompts", "path": "prompts.jsonl", "max_prompt_len": 48}}
      ]
    }

``data.type`` names the dataset class; its other keys are that class's keyword arguments
(``records`` may be a list of JSON objects, written back as JSON strings). ``reward`` is
``module:function``, imported with the config's directory on ``sys.path``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DATASETS = ("ChatMessages", "PreferencePairs", "Prompts")
_PATH_KEYS = ("path", "tokenizer", "val_path")


def _dataset(spec: Mapping[str, Any], base: Path, where: str) -> Any:
    from dew.data.chat import ChatMessages
    from dew.data.preference import PreferencePairs
    from dew.data.prompts import Prompts

    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ValueError(f"{where}.data: expected an object with a 'type' of {DATASETS}")
    kind = spec["type"]
    classes = {"ChatMessages": ChatMessages, "PreferencePairs": PreferencePairs, "Prompts": Prompts}
    if kind not in classes:
        raise ValueError(f"{where}.data.type: expected one of {DATASETS}, got {kind!r}")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    for key in _PATH_KEYS:
        value = kwargs.get(key)
        if isinstance(value, str) and not os.path.isabs(value) and (base / value).exists():
            kwargs[key] = str(base / value)
    if isinstance(kwargs.get("records"), list):
        kwargs["records"] = tuple(
            r if isinstance(r, str) else json.dumps(r) for r in kwargs["records"]
        )
    try:
        return classes[kind](**kwargs)
    except TypeError as err:
        raise ValueError(f"{where}.data: {kind} does not take these arguments: {err}") from err


def _reward(spec: Any, where: str) -> Any:
    if spec is None:
        return None
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{where}.reward: expected 'module:function', got {spec!r}")
    module, name = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{where}.reward: cannot import {spec!r}: {err}") from err
    if not callable(fn):
        raise ValueError(f"{where}.reward: {spec!r} is not callable")
    return fn


def _optimizer(spec: Mapping[str, Any]) -> Any:
    import optax

    spec = dict(spec)
    name = spec.pop("name", "adamw")
    factory = getattr(optax, name, None)
    if factory is None or not callable(factory):
        raise ValueError(f"optimizer.name: optax has no optimizer {name!r}")
    return factory(**spec)


def recipe_from_config(path: str | os.PathLike[str]) -> Any:
    """Build the ``Recipe`` a JSON config describes (see the module docstring)."""
    import jax

    import dew.models
    from dew.recipes.chain import Recipe, Stage

    path = Path(path)
    config = json.loads(path.read_text())
    base = path.resolve().parent
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    for key in ("output", "batch", "model", "stages"):
        if key not in config:
            raise ValueError(f"{path}: missing key {key!r}")
    model_spec = dict(config["model"])
    pretrained = None
    if config.get("pretrained"):
        loaded = dew.models.load_pretrained(str(base / config["pretrained"]))
        model, pretrained = loaded.model, loaded.variables
    else:
        model = dew.models.build(model_spec.pop("name", "causal_transformer"), **model_spec)
    stages = []
    for i, spec in enumerate(config["stages"]):
        where = f"stages[{i}]"
        spec = dict(spec)
        data = _dataset(spec.pop("data", None), base, where)
        reward = _reward(spec.pop("reward", None), where)
        try:
            stages.append(Stage(data=data, reward=reward, **spec))
        except TypeError as err:
            raise ValueError(f"{where}: {err}") from err
    output = Path(config["output"])
    return Recipe(
        model=model,
        optimizer=_optimizer(config.get("optimizer", {"name": "adamw", "learning_rate": 1e-4})),
        key=jax.random.key(int(config.get("seed", 0))),
        output=output if output.is_absolute() else base / output,
        batch=int(config["batch"]),
        stages=stages,
        pretrained=pretrained,
        log_every=config.get("log_every"),
    )


def add_chain_command(commands: Any) -> argparse.ArgumentParser:
    """Add ``chain CONFIG`` to an ``argparse`` sub-command set (``dew``'s ``COMMAND``)."""
    parser = commands.add_parser(
        "chain",
        help="run SFT, DPO and GRPO stages from a JSON config",
        description="Run a recipes.chain.Recipe described by a JSON config file.",
    )
    parser.add_argument("config", help="the JSON config (see dew.recipes.cli)")
    return parser


def run_chain(args: argparse.Namespace) -> int:
    """Run the chain of ``args.config``; prints one line per stage."""
    recipe = recipe_from_config(args.config)
    states = recipe.run()
    for stage, state in zip(recipe.stages, states):
        print(
            f"{stage.name} ({stage.kind}): step {int(state.step)}, "
            f"{int(state.updates)} updates, in {Path(recipe.output) / stage.name}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dew.recipes chain CONFIG`` (the same as ``dew chain CONFIG``)."""
    parser = argparse.ArgumentParser(prog="dew")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_chain_command(commands)
    return run_chain(parser.parse_args(argv))


__all__ = ["add_chain_command", "main", "recipe_from_config", "run_chain"]

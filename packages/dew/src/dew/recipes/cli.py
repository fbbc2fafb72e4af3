"""``dew chain CONFIG``: run a ``Recipe`` described by a YAML or JSON file.

The config (paths inside it are relative to the config file's directory)::

    output: runs/chain          # run directory; one sub-directory per stage
    batch: 8                    # rows (GRPO: prompts) per step
    seed: 0
    log_every: 10
    model: {name: causal_transformer, vocab_size: 64, emb_features: 32, num_layers: 2,
            num_heads: 2, mlp_features: 64, max_seq_len: 64}   # or {pretrained: hf-dir}
    optimizer: {name: adamw, learning_rate: 1e-4, clip: 1.0}   # dew.recipes.builder
    schedule: {kind: cosine, warmup_steps: 10}
    stages:
      - {name: lm, steps: 100, data: {type: TokenFile, path: tokens.bin, seq_len: 63}}
      - {name: sft, steps: 100,
         data: {type: ChatMessages, path: chat.jsonl, tokenizer: tok, seq_len: 63}}
      - {name: dpo, steps: 50, beta: 0.1, optimizer: {name: adam, learning_rate: 1e-6},
         data: {type: PreferencePairs, path: pairs.parquet, seq_len: 64}}
      - {name: grpo, steps: 20, beta: 0.01, reward: math, groups: 4,
         max_new_tokens: 16, sample: 40,
         data: {type: Prompts, path: prompts.jsonl, tokenizer: tok, max_prompt_len: 48}}

``model``, ``optimizer`` and ``schedule`` are read by ``dew.recipes.builder``; a stage may
give its own ``optimizer`` and ``schedule`` keys, merged over the top-level ones, and each
stage's schedule spans that stage's steps. ``data.type`` names the dataset class; its other
keys are that class's keyword arguments (``records`` may be a list of JSON objects).
``reward`` is ``math`` (``dew.rewards.MathReward``), ``module:object``, imported with the
config's directory on ``sys.path``, or ``code`` (programs run in ``dew-sandbox``'s fleet, open
for the whole chain); a class is made with ``reward_args`` as keyword arguments
(``dew.recipes.references.make_reward``, as ``dew train`` does). When a GRPO stage's prompts
name a ``tokenizer``, its reward receives the completions decoded to text.

A GRPO stage may give ``dew train grpo``'s ``source`` section (``kind: environment``: tool
episodes against a worker, no ``data`` or ``reward``; ``dew.recipes.source_config.stage_source``,
errors named ``stages.N.source.<key>``). A stage of ``kind: flow`` (alias ``flow-grpo``) gives
``dew train flow``'s sections but ``run`` (``dew.recipes.flow_stage``); ``model`` is required
only when a text stage needs the decoder. A ``lora`` section (top level: every text stage;
a stage's own keys merged over it, ``false`` for every weight) trains adapters and hands
on merged weights (``dew.recipes.chain_lora``; errors ``lora.<key>``,
``stages.N.lora.<key>``).

The whole config is checked before any stage trains: every key (an unknown one is refused
naming the nearest valid key), every value, every local file, every reward import and every
dataset's rows. ``overrides`` (``--set stages.0.steps=10``) change keys before the check.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dew.checks import is_int
from dew.recipes.chain_lora import check_lora_targets, top_lora
from dew.recipes.chain_stage_config import chain_stage, stage_keys
from dew.recipes.references import load_reward, local_path
from dew.recipes.schema import ConfigError, apply_override, directory_path, load_file, unknown_key

_TOP_KEYS = ("output", "batch", "seed", "model", "pretrained", "optimizer", "schedule",
             "log_every", "lora", "stages")  # fmt: skip


def recipe_from_config(path: str | os.PathLike[str], overrides: Sequence[str] = (),
                       stack: contextlib.ExitStack | None = None) -> Any:  # fmt: skip
    """Build the ``Recipe`` a YAML or JSON config describes (see the module docstring).

    ``stack`` keeps open what the stages use while the recipe runs (the fleet of a ``code``
    reward, refused without one); the caller closes it after ``Recipe.run``."""
    import jax

    from dew.recipes.builder import build_model, model_config
    from dew.recipes.chain import Recipe

    path = Path(path)
    config = load_file(path)
    for assignment in overrides:
        apply_override(config, assignment)
    base = path.resolve().parent
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    batch, seed, log_every = _top_level(config, path)
    model_cfg = model_config(_model_spec(config, base)) if "model" in config else None
    top_lora(config)  # the top-level lora section alone, before any stage merges it
    stage_specs = config["stages"]
    if not isinstance(stage_specs, list) or not stage_specs:
        raise ConfigError(f"stages: expected a non-empty list of stages, got {stage_specs!r}")
    output = Path(os.path.expanduser(str(config["output"])))
    output = output if output.is_absolute() else base / output
    directory_path(output, "output")
    valid = stage_keys()
    optimizers: dict[str, Any] = {}
    stages = []
    for i, spec in enumerate(stage_specs):
        where = f"stages.{i}"
        stage, optimizer = chain_stage(config, spec, where, (base, output, batch), valid, stack)
        optimizers[stage.name] = optimizer
        stages.append(stage)
    model, pretrained = None, None
    if any(optimizer is not None for optimizer in optimizers.values()):  # a decoder stage
        if model_cfg is None:
            raise ConfigError(f"model: required, missing from {path} (the text stages' decoder)")
        model, pretrained = build_model(model_cfg, **_episode_room(stages))
        check_lora_targets(stages, model)
        _check_token_files(stages, model)
    return Recipe(
        model=model,
        optimizer=lambda stage: optimizers[stage.name],
        key=jax.random.key(seed),
        output=output,
        batch=batch,
        stages=stages,
        pretrained=pretrained,
        log_every=log_every,
        base_path=None if model_cfg is None else model_cfg.pretrained,
    )


def _episode_room(stages: Sequence[Any]) -> dict[str, Any]:
    """``build_model``'s ``max_seq_len`` and ``length_from`` for the longest turn of the
    stages on tool episodes (sampling pads the context and the turn each to a power of
    two, at least 16); empty without such a stage."""
    from dew.inference.compiled import bucket

    needs = [(bucket(s.source.max_prompt_tokens) + bucket(s.max_new_tokens), i, s)
             for i, s in enumerate(stages) if getattr(s, "source", None) is not None]  # fmt: skip
    if not needs:
        return {}
    room, i, stage = max(needs, key=lambda need: need[0])
    why = (f"stages.{i}.source.max_prompt_tokens {stage.source.max_prompt_tokens} + "
           f"stages.{i}.max_new_tokens {stage.max_new_tokens} need ({room}; sampling pads "
           "each to a power of two, at least 16)")  # fmt: skip
    return {"max_seq_len": room, "length_from": why}


def _check_token_files(stages: Sequence[Any], model: Any) -> None:
    """Read every id of each ``TokenFile`` stage and refuse one outside ``model``'s
    vocabulary (``stages.N.data.path``), before any stage trains."""
    from dew.data.tokens import TokenFile
    from dew.recipes.train_data import check_token_ids

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    for i, stage in enumerate(stages):
        data = getattr(stage, "data", None)
        if isinstance(data, TokenFile):
            check_token_ids(data.path, data.dtype, vocab, f"stages.{i}.data.path")
            if data.val_path is not None:
                check_token_ids(data.val_path, data.dtype, vocab, f"stages.{i}.data.val_path")


def _top_level(config: Mapping[str, Any], path: Path) -> tuple[int, int, int | None]:
    """Check the top-level keys and return ``batch``, ``seed`` and ``log_every``."""
    for key in config:
        if key not in _TOP_KEYS:
            raise unknown_key("", str(key), _TOP_KEYS)
    for key in ("output", "batch", "stages"):
        if key not in config:
            raise ConfigError(f"{key}: required, missing from {path}")
    batch = config["batch"]
    if not is_int(batch) or batch < 1:
        raise ConfigError(f"batch: expected a positive integer, got {batch!r}")
    seed = config.get("seed", 0)
    if not is_int(seed):
        raise ConfigError(f"seed: expected an integer, got {seed!r}")
    log_every = config.get("log_every")
    if log_every is not None and (not is_int(log_every) or log_every < 1):
        raise ConfigError(f"log_every: expected a positive integer, got {log_every!r}")
    return batch, seed, log_every


def _model_spec(config: Mapping[str, Any], base: Path) -> Any:
    """The ``model`` spec with a top-level ``pretrained`` folded in and its path resolved."""
    model_spec = config["model"]
    if config.get("pretrained"):
        model_spec = {**(model_spec or {}), "pretrained": config["pretrained"]}
    if isinstance(model_spec, Mapping) and model_spec.get("pretrained"):
        model_spec = dict(model_spec)
        model_spec["pretrained"] = local_path(model_spec["pretrained"], base, "model.pretrained")
    return model_spec


EXAMPLE = """example:
  dew chain chain.yaml --set optimizer.learning_rate=1e-5 --set stages.0.steps=200

The config (YAML or JSON) is described in the dew.recipes.cli module docstring and in
docs/guides/chain.md; every key is checked before the first stage trains."""


def add_chain_command(commands: Any) -> argparse.ArgumentParser:
    """Add ``chain CONFIG`` to an ``argparse`` sub-command set (``dew``'s ``COMMAND``)."""
    parser = commands.add_parser(
        "chain",
        help="run SFT, DPO and GRPO stages from a YAML or JSON config",
        description="Run a recipes.chain.Recipe described by a YAML or JSON config file.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="the config file (.yaml, .yml or .json)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. optimizer.learning_rate=1e-5 (repeatable)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over: move an existing output directory aside to OUTPUT.old-<time> "
        "(nothing is deleted)",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error"
    )
    return parser


def run_chain(args: argparse.Namespace) -> int:
    """Run the chain of ``args.config``; prints one line per stage."""
    with contextlib.ExitStack() as stack:  # a code reward's fleet, closed however it ends
        return _run_chain(args, stack)


def _run_chain(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    overrides = getattr(args, "overrides", ())
    recipe = recipe_from_config(args.config, overrides, stack)
    config = load_file(args.config)
    for assignment in overrides:
        apply_override(config, assignment)
    output = Path(recipe.output)
    if getattr(args, "fresh", False):
        from dew.recipes.train import move_aside

        moved = move_aside(str(output))
        if moved:
            print(f"dew: moved the earlier run to {moved}", flush=True)
    from dew.recipes.chain_output import check_chain_output

    check_chain_output(output, config, Path(args.config).resolve().parent)
    states = recipe.run()
    for stage, state in zip(recipe.stages, states):
        print(
            f"{stage.name} ({stage.kind}): step {int(state.step)}, "
            f"{int(state.updates)} updates, in {Path(recipe.output) / stage.name}"
        )
    return 0


__all__ = ["add_chain_command", "load_reward", "local_path", "recipe_from_config", "run_chain"]

"""Run one ``dew train`` config: data, model, objective, optimizer, Trainer, export.

``run_train(config)`` takes a checked ``TrainConfig`` (``dew.recipes.train_config``) and
trains it in ``config.run.run_dir``. Everything that can be checked is checked before the
first step: the data is read (every row), the model built and the run directory compared
with the run it already holds. ``RUN_DIR/config.json`` is written only then, so a start that
fails (a bad path, a bad value) leaves the directory free for the corrected command.

A run directory that holds a checkpoint resumes from it; its ``config.json`` must agree on
the kind, the model and the training data (validation data, step counts and the optimizer
may change between runs).

A GRPO config with ``rollout.mode: async`` draws its batches with ``dew-rollout``'s
``RolloutScheduler`` (``dew.recipes.async_run.attach``), one or more batches ahead of the
update; everything it opens is closed when the run ends, fails or is interrupted.

A GRPO or PPO config with ``source: {kind: environment}`` trains on tool episodes against a
worker process instead of prompts (``dew.recipes.environment_run``; with GRPO's
``rollout.mode: async`` the scheduler draws those episodes ahead); a GRPO config with
``source: {kind: harbor}`` trains on Harbor trials behind a recording gateway
(``dew.recipes.harbor_run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dew.files import atomic_write
from dew.recipes.builder import build_model, build_optimizer
from dew.recipes.references import make_reward
from dew.recipes.schema import ConfigError
from dew.recipes.stages import OPTION_KEYS, build_stage
from dew.recipes.train_config import RL_KINDS, TrainConfig
from dew.recipes.train_data import generation_room, on_path, read_data, token_count


@dataclass
class Prepared:
    """What a config resolves to before training."""

    data: Any
    objective: Any
    rollout: Any
    model: Any
    vocab_size: int
    evaluator: Any = None
    #: ``start(run_dir, stack)``, called once the run directory is settled (moved aside,
    #: checked) and before the first step, to open what lives there (the episode journal)
    #: inside ``stack``; None: nothing to open.
    start: Callable[[str, contextlib.ExitStack], None] | None = None
    #: ``attach(trainer, data, run_dir, stack) -> data``: put an asynchronous rollout in
    #: place of ``trainer.rollout`` and return the dataset to train on (as
    #: ``dew.recipes.async_run.attach`` does for prompts); None: the ``rollout`` section's.
    attach: Callable[[Any, Any, str, contextlib.ExitStack], Any] | None = None


def prepare(config: TrainConfig, stack: contextlib.ExitStack | None = None) -> Prepared:
    """Read the data, build the model, the objective and (GRPO, PPO) the rollout.

    ``stack`` holds what must stay open while the run trains and be closed after it (the
    sandbox fleet of ``objective.reward: code``, which needs one)."""
    if getattr(config.source, "kind", None) == "harbor":
        from dew.recipes.harbor_run import prepare_harbor

        return Prepared(**prepare_harbor(config))
    if config.source is not None:
        from dew.recipes.environment_run import prepare_environment

        return Prepared(**prepare_environment(config))
    tokenizer = getattr(config.data, "tokenizer", None)
    if tokenizer is not None:  # a missing directory or failed Hub lookup, named by its key
        from dew.data.chat.template import load_chat_tokenizer

        load_chat_tokenizer(tokenizer, "data.tokenizer")
    data, vocab, width = read_data(config)
    room = width if config.kind not in RL_KINDS else max(width, generation_room(config))
    why = None
    if config.kind in RL_KINDS:
        prompt, new = config.data.max_prompt_len, config.objective.max_new_tokens
        why = (f"data.max_prompt_len {prompt} + objective.max_new_tokens {new} need ({room}; "
               "sampling pads each to a power of two, at least 16)")  # fmt: skip
    options = {
        k: v
        for k, v in dataclasses.asdict(config.objective).items()
        if k not in ("reward", "reward_args")
    }
    if config.kind in ("lm", "sft"):  # the keys of the other kind keep their defaults
        options = {k: v for k, v in options.items() if k in OPTION_KEYS[config.kind]}
    if options.get("name") in ("masked_diffusion", "block_diffusion"):  # the mask id's row
        from dew.recipes.diffusion_config import fill_diffusion_ids

        vocab = fill_diffusion_ids(config, options, vocab, token_count(config))
    model, pretrained = build_model(
        config.model, vocab_size=vocab, max_seq_len=room, length_from=why
    )
    reward: Callable[..., float] | None = None
    decode: Callable[[Any], str] | None = None
    if config.kind in RL_KINDS:
        on_path()
        reward = make_reward(
            config.objective.reward, "objective.reward", config.objective.reward_args, stack
        )
        if config.data.tokenizer is not None:
            from dew.data.chat.template import load_chat_tokenizer

            tok = load_chat_tokenizer(config.data.tokenizer, "data.tokenizer")
            decode = tok.decode
            if options["eos_id"] is None and tok.special.get("eos_token"):
                options["eos_id"] = tok.tokenizer.token_to_id(tok.special["eos_token"])
    adapter = None
    if config.lora is not None:
        from dew.recipes.lora_config import adapter_wrapper

        adapter = adapter_wrapper(config.lora, model, config.model.pretrained)
    objective, rollout = build_stage(config.kind, model, width, options, pretrained=pretrained,
                                     reward=reward, decode=decode, adapter=adapter)  # fmt: skip
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", vocab))
    evaluator = None
    if config.kind in RL_KINDS and config.data.val_path is not None and reward is not None:
        sampler = model if config.lora is None else objective.model  # LoRA: the adapter's
        evaluator = _held_out_reward(config, sampler, objective, reward, options["eos_id"])
    return Prepared(data=data, objective=objective, rollout=rollout, model=model, vocab_size=vocab,
                    evaluator=evaluator)  # fmt: skip


def _held_out_reward(
    config: TrainConfig, model: Any, objective: Any, reward: Any, eos_id: int | None
) -> Any:
    """The validation of a GRPO or PPO run: greedy completions of ``data.val_path`` scored
    by the run's reward (``dew.recipes.reward_eval``)."""
    from dew.data.prompts import Prompts
    from dew.recipes.reward_eval import HeldOutReward

    d = config.data
    tokenizer = None
    if d.tokenizer is not None:
        from dew.data.chat.template import load_chat_tokenizer

        tokenizer = load_chat_tokenizer(d.tokenizer, "data.tokenizer")
    options: dict[str, Any] = {"seed": config.run.seed, "max_prompt_len": d.max_prompt_len}
    if d.tokenizer is not None:
        options["tokenizer"] = d.tokenizer
    return HeldOutReward(model, Prompts(d.val_path, **options), reward,
                         max_new_tokens=config.objective.max_new_tokens, eos_id=eos_id,
                         tokenizer=tokenizer,
                         policy_of=getattr(objective, "policy_variables", None))  # fmt: skip


def move_aside(run_dir: str) -> str | None:
    """Rename a non-empty ``run_dir`` to ``run_dir.old-YYYYmmdd-HHMMSS`` (a counter is added
    when that exists too); returns the new name, or None when there was nothing to move."""
    import time

    if not os.path.isdir(run_dir) or not os.listdir(run_dir):
        return None
    base = f"{os.path.normpath(run_dir)}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = base, 1
    while os.path.exists(target):
        n += 1
        target = f"{base}-{n}"
    os.replace(run_dir, target)
    return target


def resume_checkpoint(run_dir: str, spec: str | None) -> str | None:
    """The checkpoint directory ``run.resume_from`` names: a step of ``run_dir``'s
    checkpoints, or a checkpoint directory; None when ``spec`` is None."""
    from dew.trainer.checkpoint import list_checkpoints

    if spec is None:
        return None
    text = str(spec).strip()
    if text.isdigit():
        found = dict(list_checkpoints(run_dir))
        if int(text) not in found:
            have = ", ".join(str(s) for s in sorted(found)) or "none"
            raise ConfigError(
                f"run.resume_from: {run_dir} has no checkpoint of step {int(text)} "
                f"(its checkpoints: {have})"
            )
        return found[int(text)]
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(os.path.join(path, "meta.json")):
        raise ConfigError(
            f"run.resume_from: {text!r} is neither a step number nor a checkpoint directory "
            "(one holding meta.json, like RUN_DIR/checkpoints/step_00000100)"
        )
    return path


_SAME = ("kind", "model", "data", "source", "lora")
_MAY_CHANGE = ("val_path", "val_tokens", "val_batches", "journal", "remat", "scan_layers")


def check_run_dir(config: TrainConfig) -> None:
    """Refuse a run directory whose checkpoints come from a run of other settings."""
    check_same_run(config.run.run_dir, config.as_dict(), _SAME, _MAY_CHANGE)


def check_same_run(
    run_dir: str, new: Mapping[str, Any], sections: Sequence[str], may_change: Sequence[str] = ()
) -> None:
    """Refuse ``run_dir`` when it holds checkpoints and a ``config.json`` whose ``sections``
    differ from ``new``'s (a config as plain mappings); keys named in ``may_change`` may
    differ. The error lists every difference as ``section.key old -> new``."""
    from dew.trainer.checkpoint import list_checkpoints

    path = os.path.join(run_dir, "config.json")
    if not list_checkpoints(run_dir) or not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"run.run_dir: {path} is unreadable ({err})") from None
    new = json.loads(json.dumps(new))  # tuples as the file holds them: lists
    diffs = []
    for name in sections:
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key not in may_change and a.get(key) != b.get(key):
                    diffs.append(f"{name}.{key} {a.get(key)!r} -> {b.get(key)!r}")
        elif a != b:
            diffs.append(f"{name} {a!r} -> {b!r}")
    if diffs:
        raise ConfigError(
            f"run.run_dir: {run_dir} holds a run started with other settings "
            f"({'; '.join(diffs)}); use a new run directory"
        )


def write_config(config: TrainConfig) -> None:
    """``RUN_DIR/config.json``, written atomically."""
    run_dir = config.run.run_dir
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "config.json")
    with atomic_write(path, "w") as f:
        json.dump(config.as_dict(), f, indent=1, sort_keys=True)


def run_train(config: TrainConfig) -> Any:
    """Train ``config`` to ``config.run.steps`` (resuming when it can); the final state.

    What the run holds open (a ``code`` reward's sandbox fleet, an asynchronous rollout's
    engine and scheduler, tool workers) is closed when it returns or raises, the latest
    opened first. JAX's persistent compilation cache follows ``run.compile_cache`` and
    ``run.compile_cache_dir`` (``dew.compile_cache.configure``)."""
    from dew.compile_cache import configure

    configure(config.run.compile_cache, config.run.compile_cache_dir)
    with contextlib.ExitStack() as stack:
        return _train(config, prepare(config, stack), stack)


def owns_start(prepared: Prepared) -> bool:
    """Whether the Trainer may take the loaded weights over (``consume_pretrained``).

    True when no rollout runs beside the update (LM, SFT, diffusion and DPO stages, LoRA
    or not): then nothing but the objective holds the weights ``build_model`` loaded, and a
    frozen reference (DPO's) is copied into the state, so the first state can own them and
    the run holds one copy. A rollout (GRPO, PPO, tool episodes, Harbor) may keep the
    starting weights as its own reference (the KL-in-reward charge), and PPO's critic starts
    from the same arrays, so those keep the copying default.
    """
    return prepared.rollout is None and prepared.attach is None


def _train(config: TrainConfig, prepared: Prepared, stack: contextlib.ExitStack) -> Any:
    """Train what ``prepare`` built; ``stack`` closes the run's engine, fleet and workers."""
    import jax

    from dew.trainer import Trainer

    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab_size=prepared.vocab_size)
    )
    if config.run.fresh:
        moved = move_aside(config.run.run_dir)
        if moved:
            print(f"dew: moved the earlier run to {moved}", flush=True)
    resume = resume_checkpoint(config.run.run_dir, config.run.resume_from)
    check_run_dir(config)
    r = config.run
    optimizer = build_optimizer(config.optimizer, config.schedule, steps=r.steps)
    trainer = Trainer(prepared.objective, optimizer, key=jax.random.key(r.seed),
                      rollout=prepared.rollout, microbatches=r.microbatches, fsdp=r.fsdp,
                      checkpoint_every=r.checkpoint_every, keep_checkpoints=r.keep,
                      tensorboard=r.tensorboard, trackers=r.tracker_names(),
                      progress=r.progress, evaluator=prepared.evaluator,
                      consume_pretrained=owns_start(prepared))  # fmt: skip
    data = prepared.data
    rollout = config.rollout
    attached = rollout is not None and rollout.is_async
    if prepared.attach is not None:
        data = prepared.attach(trainer, data, r.run_dir, stack)
    elif rollout is not None and attached:
        from dew.recipes.async_run import attach

        data = attach(trainer, data, rollout, batch=r.batch, seed=r.seed,
                      run_dir=r.run_dir, stack=stack)  # fmt: skip
    if prepared.start is not None:
        prepared.start(r.run_dir, stack)
    write_config(config)
    state = trainer.fit(data, steps=r.steps, log_every=r.log_every, eval_every=r.eval_every,
                        run_dir=r.run_dir, resume_from=resume)  # fmt: skip
    if attached:  # the engine ends serving the trained weights
        from dew.recipes.async_run import finish

        finish(trainer, state, r.run_dir)
    merged = None
    if config.lora is not None:  # RUN_DIR/adapter, and the merged weights for run.export
        from dew.recipes.lora_config import export_adapter

        merged = export_adapter(prepared.objective, state, r.run_dir, r.export)
    if r.export:
        from dew import models

        family = None if config.model.pretrained else config.model.name
        params = jax.device_get(state.params) if merged is None else merged
        policy_of = getattr(prepared.objective, "policy_variables", None)  # PPO: drop the critic
        if merged is None and policy_of is not None:  # merged: already the policy alone
            params = policy_of(params)
        models.Pretrained.from_model(prepared.model, params,
                                     family=family).save(r.export, dtype=r.export_dtype)  # fmt: skip
        tokenizer = getattr(config.data, "tokenizer", None)
        if tokenizer is not None:  # the exported directory loads on its own
            from dew.data.chat.template import copy_tokenizer

            copy_tokenizer(tokenizer, r.export)
    return state


__all__ = ["Prepared", "check_run_dir", "check_same_run", "move_aside", "owns_start", "prepare",
           "resume_checkpoint", "run_train", "write_config"]  # fmt: skip

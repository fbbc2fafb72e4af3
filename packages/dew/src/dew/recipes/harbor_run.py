"""A ``dew train grpo`` run on Harbor trials: ``source: {kind: harbor}``.

``prepare_harbor(config)`` turns a checked config whose ``source`` is a ``HarborConfig``
(``dew.recipes.harbor_config``) into the pieces ``dew.recipes.train`` trains:

- the model (``model.vocab_size`` is required unless the model is pretrained: the engine's
  ids have no other bound), sized for rows of ``W = source.width``;
- ``GRPOObjective`` over rows ``W`` wide (``seq_len = W - 1``), with ``objective``'s loss
  keys;
- the data: ``task_ids(T, batch, seed)`` over the ``T`` task directories of
  ``source.tasks`` (``dew.recipes.environment_run.task_ids``);
- ``attach``, run once the trainer exists: it calls ``dew-rollout``'s ``harbor_rollout``
  (found through the entry-point group ``dew.recipes``; ``dew`` never imports
  ``dew.rollout``), which starts the sandbox proxy, the gateway client, the engine's weight
  pushes, the ``HarborSource`` and the ``RolloutScheduler`` (``run.batch`` tasks x
  ``objective.groups`` trials, ``source.chains`` rows per trial), all closed by the run's
  stack, and puts the scheduler in place of the trainer's rollout.

The plugin is looked up here, before anything starts, so a missing ``dew-rollout`` is a
config error naming ``source.kind``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

from dew.recipes.harbor_config import HarborConfig, task_directories
from dew.recipes.plugins import load_plugin
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import TrainConfig


def _model(config: TrainConfig, width: int) -> tuple[Any, Any, int]:
    from dew.recipes.builder import build_model

    vocab = config.model.vocab_size
    if vocab is None and config.model.pretrained is None:
        raise ConfigError("model.vocab_size: required with source.kind harbor (the engine's "
                          "token ids have no other bound), missing")  # fmt: skip
    model, pretrained = build_model(config.model, vocab_size=vocab, max_seq_len=width,
                                    length_from=f"source.width {width}")  # fmt: skip
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return model, pretrained, int(size or vocab or 0)


def _unused_reward(*args: Any) -> float:  # build_stage's prompt rollout, never called
    raise AssertionError("Harbor trials are scored by each task's verifier")


def prepare_harbor(config: TrainConfig) -> dict[str, Any]:
    """The parts of a run on Harbor trials, as ``dew.recipes.train.Prepared``'s keyword
    arguments: ``data``, ``objective``, ``rollout``, ``model``, ``vocab_size``, ``attach``
    (see the module docstring). Nothing starts yet: ``attach`` starts the trials' side."""
    from dew.recipes.environment_run import task_ids
    from dew.recipes.stages import build_stage

    source, o, r = config.source, config.objective, config.run
    assert isinstance(source, HarborConfig) and config.rollout is not None
    build = load_plugin("harbor_rollout", "source.kind", "dew-rollout")
    table = dict(enumerate(task_directories(source.tasks)))
    model, pretrained, vocab = _model(config, source.width)
    options = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("reward", "reward_args")}
    objective, sampled = build_stage("grpo", model, source.width, options, pretrained=pretrained,
                                     reward=_unused_reward)  # fmt: skip
    rollout = config.rollout

    def attach(trainer: Any, data: Any, run_dir: str, stack: contextlib.ExitStack) -> Any:
        import jax

        params = jax.device_get(trainer.initial_state().params)
        trials = source.trials or os.path.join(run_dir, "trials")
        scheduler = build(
            objective=objective, model=objective.model, params=params, source=source,
            rollout=rollout, tasks=table, trials=trials, width=source.width,
            rows=r.batch * o.groups * source.chains, groups=o.groups, estimator=o.estimator,
            seed=r.seed, run_dir=run_dir, stack=stack, progress=trainer.progress,
        )  # fmt: skip
        trainer.rollout = scheduler
        return scheduler.tasks(data)

    data = task_ids(len(table), r.batch, r.seed)
    return {"data": data, "objective": objective, "rollout": sampled, "model": model,
            "vocab_size": vocab, "attach": attach}  # fmt: skip


__all__ = ["prepare_harbor"]

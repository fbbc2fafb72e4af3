"""Put an asynchronous rollout (``rollout.mode: async``) in place of a GRPO or PPO trainer's own.

``dew train grpo`` (``dew.recipes.train``) and a GRPO stage of ``dew chain``
(``dew.recipes.chain``) build a ``Trainer`` whose rollout is a ``SampledRollout``: it samples
each batch in the trainer's process, then the trainer updates on it. With ``mode: async``,
``attach`` replaces that rollout with a ``RolloutScheduler`` from ``dew-rollout`` (found
through the entry point ``async_rollout`` of the group ``dew.recipes``; ``dew`` never imports
``dew.rollout``), which draws batches ahead while the trainer updates. The scheduler keeps
the ``SampledRollout``'s reward, decoding, sampling, groups, response budget and estimator,
and serves the trainer's starting variables as version 0.

A run on tool episodes (``source: {kind: environment}``) builds an ``EpisodeRollout``
instead; ``attach`` then hands the scheduler its environment factory, verifier, context
budget and turns (``episodes``), so an ``EnvironmentSource`` runs the episodes on the engine,
and its ``record`` (``EpisodeLog``) gets each training batch's sessions.

A PPO trainer's rollout is a ``PPORollout`` around such a sampler (prompts or episodes). The
scheduler then takes the sampler's place inside it (``SessionRewards`` adds the per-session
``rewards`` GAE needs), so the critic's values and the GAE targets are still computed on
each drawn batch with the current critic; the engine serves, and the scheduler rescores
with, the policy half of the variables (``PPOObjective.policy_variables``).

Everything ``attach`` opens (the engine, the reward workers, the scheduler's journal) is
closed by the caller's ``contextlib.ExitStack``: on a normal end, an error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from dew.recipes.plugins import load_plugin
from dew.recipes.rollout_config import RolloutConfig, rollout_config
from dew.recipes.schema import ConfigError


def _eos_ids(sampling: Any) -> tuple[int, ...] | None:
    eos = getattr(sampling, "eos_id", None)
    if eos is None:
        return None
    return tuple(int(e) for e in eos) if isinstance(eos, tuple | list) else (int(eos),)


def attach(
    trainer: Any,
    data: Any,
    config: RolloutConfig,
    *,
    batch: int,
    seed: int,
    run_dir: str | os.PathLike[str],
    stack: contextlib.ExitStack,
    where: str = "rollout",
) -> Any:
    """Replace ``trainer.rollout`` (a ``SampledRollout`` or ``EpisodeRollout``) with the
    asynchronous scheduler ``config`` describes, and return ``data`` wrapped so the scheduler
    sees each batch as the trainer reads it (train on the returned dataset).

    Args:
      trainer: a ``dew.trainer.Trainer`` built with the stage's ``SampledRollout`` (or a
        tool-episode run's ``EpisodeRollout``).
      data: the prompts' ``Dataset`` (``Prompts.load(batch)``), or the task ids'
        (``dew.recipes.environment_run.task_ids``).
      config: the ``rollout`` section, ``mode: async``.
      batch: prompts per step (the scheduler packs ``batch * groups`` rows).
      seed: the run's seed; run_dir: the run directory (journal and records go there).
      stack: closes what the scheduler opened.
      where: the config key named when ``dew-rollout`` is not installed.

    Raises:
      ConfigError: ``dew-rollout`` is not installed (naming ``where.mode``).
    """
    import jax

    ppo = _ppo(trainer)
    drawn = trainer.rollout if ppo is None else ppo.episodes
    # the objective the scheduler rescores with: PPO's policy half (with its behaviour
    # correction), else the sampler's (an EpisodeRollout has none: the trainer's)
    objective = getattr(drawn, "objective", trainer.objective) if ppo is None else \
        ppo.objective.policy_objective  # fmt: skip
    names = {"overlong": "overlong_buffer", "kl_in_reward": "kl_in_reward"}
    for key, name in names.items():  # applied by the trainer's own sampler only
        if getattr(drawn, key, None) is not None:
            raise ConfigError(f"{name}: {where}.mode async does not apply it (the scheduler "
                              "draws the batches); expected mode: sync, or it unset")  # fmt: skip
    dynamic = getattr(drawn, "dynamic_sampling", None)  # the scheduler's admission filters
    if dynamic is not None and config.admit is not None:
        raise ConfigError(f"{where}.admit: dynamic sampling admits its own {dynamic.groups} "
                          f"groups; expected admit unset, got {config.admit}")  # fmt: skip
    build = load_plugin("async_rollout", f"{where}.mode", "dew-rollout")
    params = _policy_half(trainer, jax.device_get(trainer.initial_state().params))
    scheduler = build(
        objective=objective, model=objective.model, params=params,
        rollout=config, width=objective.width, rows=batch * drawn.groups, groups=drawn.groups,
        max_new_tokens=drawn.max_new_tokens, sampling=drawn.sampling,
        eos_ids=_eos_ids(drawn.sampling), estimator=drawn.estimator, seed=seed,
        run_dir=os.fspath(run_dir), stack=stack, progress=trainer.progress, **_source(drawn),
        correction=getattr(drawn, "correction", None), dynamic_sampling=dynamic,
    )  # fmt: skip
    if ppo is None:
        trainer.rollout = scheduler
    else:
        ppo.episodes = SessionRewards(scheduler)
    return scheduler.tasks(data)


def _ppo(trainer: Any) -> Any:
    """The trainer's ``PPORollout``, or None for a GRPO trainer."""
    from dew.rollouts.ppo import PPORollout

    return trainer.rollout if isinstance(trainer.rollout, PPORollout) else None


def _policy_half(trainer: Any, variables: Any) -> Any:
    """What the engine serves of the trainer's ``variables``: a PPO trainer's policy half."""
    ppo = _ppo(trainer)
    return variables if ppo is None else ppo.objective.policy_variables(variables)


def _scheduler(trainer: Any) -> Any:
    """The scheduler ``attach`` put in ``trainer``."""
    ppo = _ppo(trainer)
    return trainer.rollout if ppo is None else ppo.episodes.scheduler


class SessionRewards:
    """A ``PPORollout``'s sampler drawing from an asynchronous ``scheduler``: its batches
    with ``rewards``, ``[S]`` float32, the reward of each admitted session (``0`` when it
    has none) in the order the batch's ``session_index`` counts them."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def at_step(self, step: int, updates: int) -> None:
        self.scheduler.at_step(step, updates)

    @property
    def last_metrics(self) -> dict[str, float]:
        """The scheduler's (its correction bounds, when it adapts them)."""
        return self.scheduler.last_metrics

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (its correction bounds), for the checkpoint."""
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state: Any) -> None:
        """Hand a checkpoint's state back to the scheduler."""
        self.scheduler.load_state_dict(state)

    def __call__(self, variables: Any, batch: Any, key: Any = None) -> dict[str, Any]:
        import numpy as np

        out = dict(self.scheduler(variables, batch, key))
        sessions = self.scheduler.last_sessions
        out["rewards"] = np.asarray(
            [0.0 if s.reward is None else float(s.reward) for s in sessions], np.float32
        )
        return out


def _source(drawn: Any) -> dict[str, Any]:
    """The keywords that tell the scheduler what it draws: a ``SampledRollout``'s reward and
    decoding, or an ``EpisodeRollout``'s episodes and per-batch ``record``."""
    if not hasattr(drawn, "environment_factory"):
        return {"reward": drawn.reward, "decode": drawn.decode}
    episodes = {"environment": drawn.environment_factory, "verifier": drawn.verifier,
                "max_prompt_tokens": drawn.max_prompt_tokens, "max_turns": drawn.max_turns}  # fmt: skip
    record = getattr(drawn.record, "batch", None)
    return {"reward": None, "decode": None, "episodes": episodes, "record": record}


def finish(trainer: Any, state: Any, run_dir: str | os.PathLike[str]) -> None:
    """After ``trainer.fit`` returned ``state`` under an attached scheduler: leave the engine
    serving the trained weights (pushed as the final update's version when it serves an
    older one) and, on vLLM, write ``RUN_DIR/engine-check.json`` comparing its prompt
    log-probabilities with Dew's (``dew.rollout.served_check``)."""
    import jax

    end = load_plugin("finish_rollout", "rollout.mode", "dew-rollout")
    params = _policy_half(trainer, jax.device_get(state.params))
    end(_scheduler(trainer), params, int(jax.device_get(state.updates)), os.fspath(run_dir))


def stage_rollout(spec: Any, data: Any, where: str) -> RolloutConfig:
    """The checked ``rollout`` key of a ``dew chain`` stage ``spec`` (errors name
    ``where.rollout.<key>``): a GRPO or PPO stage's only (on prompts or tool episodes), and
    in ``mode: async`` with a lag it needs the stage's ``behavior_importance``."""
    from dew.data.prompts import Prompts

    config = rollout_config(spec.get("rollout"), f"{where}.rollout")
    if not isinstance(data, Prompts) and spec.get("source") is None:
        raise ConfigError(
            f"{where}.rollout: only a GRPO or PPO stage (data type Prompts, or an environment "
            f"source) takes it, this stage's data is {type(data).__name__}"
        )
    if config.is_async and config.max_lag and spec.get("behavior_importance") is None:
        raise ConfigError(
            f"{where}.behavior_importance: rollout.max_lag {config.max_lag} lets rollouts "
            "train on older weights, which needs a correction: a TIS cap (a number such as "
            "2.0) or an IcePop band [low, high]"
        )
    return config


__all__ = ["SessionRewards", "attach", "finish", "stage_rollout"]

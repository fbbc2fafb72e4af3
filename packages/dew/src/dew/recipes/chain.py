"""Chain SFT, DPO, GRPO and PPO stages over one decoder: ``Recipe`` and ``Stage``.

Each ``Stage`` names a directory, a dataset and a step count. Unless its ``kind`` says
otherwise (``lm`` on ``ChatMessages``, ``ppo`` on ``Prompts``: ``dew.recipes.ppo_stage``), the
dataset's type picks the objective:

=====================  =====================================================================
``ChatMessages``       SFT: ``LMObjective(model, data.seq_len, loss_role=Role.ASSISTANT)``
``PreferencePairs``    DPO: ``DPOObjective(model, data.seq_len - 1, beta, nll_weight)``
``Prompts``            GRPO: ``GRPOObjective(model, P + R - 1, beta)`` fed by
                       ``SampledRollout(objective, reward, groups, R, Sampling(top_k=sample))``
``TokenFile``          LM: ``LMObjective(model, data.seq_len)`` over every id of the file
                       (e.g. a warm-up on transcripts before RL on tool episodes)
=====================  =====================================================================

A stage starts from the previous stage's final policy variables (the first from
``Recipe.pretrained``, or a fresh initialisation) with a fresh optimizer state and step
counter. DPO and GRPO (with ``beta > 0``) freeze that start as their reference. Each stage
trains in ``output / stage.name`` through ``Trainer.fit(run_dir=...)``, so a stage whose
directory already holds a checkpoint resumes from it, and a finished one restores without
training. The name only labels the directory; it never changes how data is read.

GRPO stages take the sampling keys (``groups``, ``max_new_tokens``, ``sample`` the top-k,
``temperature``, ``eos_id``, ``decode``, ``estimator``), GRPO's loss keys and the shaping
keys, as ``dew train`` does (``build_stage``). A GRPO or PPO stage's ``rollout`` with
``mode: async`` draws its batches (prompts or tool episodes) ahead of the update
(``dew.recipes.async_run``). A stage with an environment ``source`` (no data) trains GRPO or
PPO on tool episodes as ``dew train`` does (``dew.recipes.environment_run``). A
``dew.recipes.flow_stage.FlowStage`` runs ``dew-flow``'s Flow-GRPO on its own image model.
A stage with a ``lora`` trains an adapter on its frozen start and hands on the merged
weights (``dew.recipes.chain_lora``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from dew.checks import is_int
from dew.recipes.chain_checks import PPO_ONLY, check_stage
from dew.recipes.chain_lora import MERGED, hand_off
from dew.recipes.chain_parts import stage_parts, stage_seed
from dew.recipes.flow_stage import FlowStage
from dew.recipes.ppo_stage import PPO_KEYS
from dew.recipes.shaping_config import SHAPING_KEYS, RewardShapingOptions
from dew.recipes.stages import LOSS_KEYS, GRPOLoss


@dataclass(frozen=True)
class Stage(GRPOLoss, RewardShapingOptions):
    """One stage of a chain.

    Attributes:
      name: directory name under ``Recipe.output`` (distinct per stage).
      data: ``ChatMessages`` (SFT), ``PreferencePairs`` (DPO), ``Prompts`` (GRPO) or
        ``TokenFile`` (LM).
      steps: optimizer steps of this stage.
      beta: DPO's preference scale (default 0.1) or GRPO's KL coefficient (default 0).
      nll_weight: DPO only: RPO's weight of the chosen answers' token-mean NLL (default 0).
      reward: GRPO's ``reward(data_source, completion, ground_truth, extra_info) -> float``.
      groups: GRPO completions per prompt (>= 2).
      max_new_tokens: GRPO response budget.
      sample: GRPO sampler top-k (None: the full softmax).
      temperature: GRPO sampling temperature, > 0 (None: 1.0); the objective scores the
        sampled ids at the same temperature.
      eos_id: GRPO id, or tuple of ids, that ends a completion (None: completions run to
        ``max_new_tokens``).
      decode: GRPO ``decode(ids) -> str`` giving the reward's completion text (None: ids
        separated by spaces).
      estimator: GRPO's advantage estimator, ``"group"`` (default), ``"mean"`` or ``"rloo"``.
      rollout: GRPO's or PPO's ``dew.recipes.rollout_config.RolloutConfig`` (None:
        ``mode: sync``, the trainer samples each batch itself); ``mode: async`` draws batches ahead with
        ``dew-rollout``'s ``RolloutScheduler`` (``dew.recipes.async_run``).
      kind: the stage's objective, ``"lm"``, ``"sft"``, ``"dpo"``, ``"grpo"`` or ``"ppo"``;
        None (the default) infers it from the dataset (``sft``, ``dpo``, ``grpo``). The
        dataset must fit: ``ChatMessages`` for lm and sft, ``TokenFile`` for lm,
        ``PreferencePairs`` for dpo, ``Prompts`` for grpo and ppo. After construction it always holds the kind.
      gamma, lam, value_coefficient, value_clip, critic_from_policy: PPO only
        (``dew.recipes.ppo_stage``); None keeps PPO's default. A PPO stage samples
        ``groups`` completions per prompt (the default 4 applies here too), uses
        ``max_new_tokens``, ``sample``, ``temperature``, ``eos_id``, ``decode``, ``beta``,
        ``epsilon_low``, ``epsilon_high``, ``dual_clip``, ``behavior_importance``,
        ``kl_estimator`` and ``entropy_coeff``, and
        refuses GRPO's other loss keys.
      source: a ``dew.recipes.source_config.SourceConfig`` of kind ``environment``: GRPO
        (or PPO, with ``kind="ppo"``) on tool episodes (``data`` and ``reward`` None,
        ``eos_id`` required); None: the data.
      lora: a ``dew.models.lora.LoraConfig``: the stage trains that adapter on its starting
        weights, frozen (``LoraObjective``; PPO: ``LoraPPOObjective``, the critic in full),
        its reference the adapter-off start, and hands the merged weights on
        (``dew.recipes.chain_lora``); None (the default): every weight trains.

    GRPO's loss options (``dew.recipes.stages.GRPOLoss``) and the reward-shaping keys
    (``dew.recipes.shaping_config``), as ``dew train``'s, are keyword-only fields too.
    """

    name: str
    data: Any
    steps: int
    beta: float | None = None
    nll_weight: float | None = None
    reward: Callable[[str, str, str, str], float] | None = None
    groups: int = 4
    max_new_tokens: int = 16
    sample: int | None = None
    temperature: float | None = None
    eos_id: int | tuple[int, ...] | None = None
    decode: Callable[[Any], str] | None = None
    estimator: str = "group"
    rollout: Any = None
    kind: str | None = None
    gamma: float | None = None
    lam: float | None = None
    value_coefficient: float | None = None
    value_clip: float | None = None
    critic_from_policy: bool | None = None
    source: Any = None
    lora: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", check_stage(self))  # dew.recipes.chain_checks

    def ppo_options(self) -> dict[str, Any]:
        """The options ``build_stage("ppo", ...)`` takes from this stage (unset ones left out)."""
        given = {"beta": self.beta, "groups": self.groups, "max_new_tokens": self.max_new_tokens,
                 "temperature": self.temperature, "top_k": self.sample, "eos_id": self.eos_id,
                 **{key: getattr(self, key) for key in (*PPO_ONLY, *LOSS_KEYS, *SHAPING_KEYS)
                    if key in PPO_KEYS}}  # fmt: skip
        return {k: v for k, v in given.items() if v is not None or k in ("dual_clip",)}


@dataclass
class Recipe:
    """A chain of stages over one decoder.

    Attributes:
      model: the ``dew.models`` decoder the ``Stage``s share (None when all are ``FlowStage``).
      optimizer: an optax transformation, or a function ``stage -> transformation`` (one per
        ``Stage``, e.g. a schedule over its steps); each stage starts a fresh optimizer state.
      key: a PRNG key; stage ``i`` uses ``fold_in(key, i)``.
      output: run directory; stage directories go under it.
      batch: rows per step (prompts per step for GRPO, which trains on ``batch * groups``).
      stages: the ``Stage``s and ``dew.recipes.flow_stage.FlowStage``s, in order.
      pretrained: variables the first stage starts from (None: a fresh initialisation).
      log_every: metrics cadence passed to ``Trainer.fit``.
      progress: a progress bar per stage (None: only when stderr is a terminal).
      checkpoint_every: also checkpoint every this many steps inside a stage (None: only at
        the end of each stage), so a killed run resumes mid-stage.
      base_path: where ``pretrained`` was read from, recorded as the base of a first stage
        that trains an adapter (None: not recorded).
    """

    model: Any
    optimizer: Any
    key: jax.Array
    output: str | os.PathLike[str]
    batch: int
    stages: Sequence[Stage | FlowStage]
    pretrained: Mapping[str, Any] | None = None
    log_every: int | None = None
    progress: bool | None = None
    checkpoint_every: int | None = None
    base_path: str | None = None

    def __post_init__(self) -> None:
        self.stages = tuple(self.stages)
        if not self.stages:
            raise ValueError("Recipe.stages: expected at least one Stage")
        for i, stage in enumerate(self.stages):
            if not isinstance(stage, Stage | FlowStage):
                raise TypeError(f"Recipe.stages[{i}]: expected a Stage or FlowStage, got "
                                f"{type(stage).__name__}")  # fmt: skip
        names = [s.name for s in self.stages]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Recipe.stages: stage names must be distinct, repeated: {repeated}")
        if not is_int(self.batch) or self.batch < 1:
            raise ValueError(f"Recipe.batch: expected a positive int, got {self.batch!r}")
        every = self.checkpoint_every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every < 1
        ):
            raise ValueError(
                f"Recipe.checkpoint_every: expected None or a positive int, got {every!r}"
            )

    def objective(self, stage: Stage, start: Mapping[str, Any] | None) -> tuple[Any, Any]:
        """The objective and rollout (None unless GRPO or PPO) a stage trains with."""
        return stage_parts(self, stage, start, 0, self.base_path)[:2]

    def run(self) -> list[Any]:
        """Train (or restore) every stage in order; returns each stage's final ``TrainState``.

        A text stage starts from the last text stage's policy (a ``FlowStage`` in between
        trains its own model and passes nothing on); after an adapter stage, that policy is
        the merged weights written to ``output / stage.name / "merged"``."""
        from dew.trainer import Trainer

        output = Path(self.output)
        output.mkdir(parents=True, exist_ok=True)
        start = None if self.pretrained is None else jax.device_get(self.pretrained)
        base_path, states = self.base_path, []
        # every stage's data is read (and checked) before the first stage trains
        datasets = [stage.data.load(self.batch) if isinstance(stage, Stage) and stage.data
                    is not None else None for stage in self.stages]  # fmt: skip
        for index, stage in enumerate(self.stages):
            if isinstance(stage, FlowStage):
                states.append(stage.train(output / stage.name, batch=self.batch,
                                          seed=stage_seed(self.key, index), log_every=self.log_every,
                                          progress=self.progress,
                                          checkpoint_every=self.checkpoint_every))  # fmt: skip
                continue
            objective, rollout, data, opened = stage_parts(self, stage, start, index, base_path)
            trainer = Trainer(
                objective,
                self.optimizer(stage) if callable(self.optimizer) else self.optimizer,
                key=jax.random.fold_in(self.key, index),
                rollout=rollout,
                progress=self.progress,
                checkpoint_every=self.checkpoint_every,
            )
            with contextlib.ExitStack() as stack:
                data = datasets[index] if data is None else data
                if stage.rollout is not None and stage.rollout.is_async:
                    from dew.recipes.async_run import attach

                    data = attach(trainer, data, stage.rollout, batch=self.batch,
                                  seed=stage_seed(self.key, index), run_dir=output / stage.name,
                                  stack=stack, where=f"Stage.rollout ({stage.name})")  # fmt: skip
                if opened is not None:  # the episode log and journal of an environment source
                    opened(str(output / stage.name), stack)
                state = trainer.fit(data, steps=stage.steps, log_every=self.log_every,
                                    run_dir=output / stage.name)  # fmt: skip
            states.append(state)
            base_path = str(output / stage.name)
            if stage.lora is not None:  # the adapter folded in, read back from merged/
                start = hand_off(objective, state, output / stage.name, self.model)
                base_path = str(output / stage.name / MERGED)
                continue
            # host copy: the next stage's compiled steps donate their own device buffers
            start = jax.device_get(state.params)
            policy_of = getattr(objective, "policy_variables", None)  # PPO: drop the critic
            start = start if policy_of is None else policy_of(start)
        return states


__all__ = ["Recipe", "Stage"]

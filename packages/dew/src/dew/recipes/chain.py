"""Chain SFT, DPO and GRPO stages over one decoder: ``Recipe`` and ``Stage``.

Each ``Stage`` names a directory, a dataset and a step count. The dataset's type picks the
objective:

=====================  =====================================================================
``ChatMessages``       SFT: ``LMObjective(model, data.seq_len, loss_role=Role.ASSISTANT)``
``PreferencePairs``    DPO: ``DPOObjective(model, data.seq_len - 1, beta)``
``Prompts``            GRPO: ``GRPOObjective(model, P + R - 1, beta)`` fed by
                       ``SampledRollout(objective, reward, groups, R, Sampling(top_k=sample))``
=====================  =====================================================================

A stage starts from the previous stage's final policy variables (the first from
``Recipe.pretrained``, or a fresh initialisation) with a fresh optimizer state and step
counter. DPO and GRPO (with ``beta > 0``) freeze that start as their reference. Each stage
trains in ``output / stage.name`` through ``Trainer.fit(run_dir=...)``, so a stage whose
directory already holds a checkpoint resumes from it, and a finished one restores without
training. The name only labels the directory; it never changes how data is read.

GRPO stages expose ``beta``, ``reward``, ``groups``, ``max_new_tokens`` and ``sample`` (the
sampler's top-k). Decoding, EOS ids and temperature stay at ``SampledRollout``'s defaults, so
the reward reads token ids separated by spaces; build ``SampledRollout`` and ``Trainer``
yourself for anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from dew.checks import is_int
from dew.data.chat import ChatMessages, Role
from dew.data.preference import PreferencePairs
from dew.data.prompts import Prompts

DEFAULT_DPO_BETA = 0.1
DEFAULT_GRPO_BETA = 0.0


@dataclass(frozen=True)
class Stage:
    """One stage of a chain.

    Attributes:
      name: directory name under ``Recipe.output`` (distinct per stage).
      data: ``ChatMessages`` (SFT), ``PreferencePairs`` (DPO) or ``Prompts`` (GRPO).
      steps: optimizer steps of this stage.
      beta: DPO's preference scale (default 0.1) or GRPO's KL coefficient (default 0).
      reward: GRPO's ``reward(data_source, completion, ground_truth, extra_info) -> float``.
      groups: GRPO completions per prompt (>= 2).
      max_new_tokens: GRPO response budget.
      sample: GRPO sampler top-k (None: the full softmax).
    """

    name: str
    data: Any
    steps: int
    beta: float | None = None
    reward: Callable[[str, str, str, str], float] | None = None
    groups: int = 4
    max_new_tokens: int = 16
    sample: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or os.sep in self.name:
            raise ValueError(f"Stage.name: expected a plain directory name, got {self.name!r}")
        if self.name in (".", ".."):
            raise ValueError(f"Stage.name: expected a plain directory name, got {self.name!r}")
        if not isinstance(self.data, ChatMessages | PreferencePairs | Prompts):
            raise TypeError(
                f"Stage.data ({self.name}): expected ChatMessages, PreferencePairs or Prompts, "
                f"got {type(self.data).__name__}"
            )
        if not is_int(self.steps) or self.steps < 1:
            raise ValueError(
                f"Stage.steps ({self.name}): expected a positive int, got {self.steps!r}"
            )
        if isinstance(self.data, Prompts) and self.reward is None:
            raise ValueError(f"Stage.reward ({self.name}): a Prompts (GRPO) stage needs a reward")
        if not isinstance(self.data, Prompts) and self.reward is not None:
            raise ValueError(
                f"Stage.reward ({self.name}): only a Prompts (GRPO) stage takes a reward, this "
                f"stage's data is {type(self.data).__name__}"
            )

    @property
    def kind(self) -> str:
        """``"sft"``, ``"dpo"`` or ``"grpo"``, from the dataset type."""
        if isinstance(self.data, ChatMessages):
            return "sft"
        if isinstance(self.data, PreferencePairs):
            return "dpo"
        return "grpo"


@dataclass
class Recipe:
    """A chain of stages over one decoder.

    Attributes:
      model: the shared ``dew.models`` decoder.
      optimizer: an optax transformation, or a function ``stage -> transformation`` (one
        per stage, e.g. a schedule spanning that stage's steps); every stage starts a fresh
        optimizer state.
      key: a PRNG key; stage ``i`` uses ``fold_in(key, i)``.
      output: run directory; stage directories go under it.
      batch: rows per step (prompts per step for GRPO, which trains on ``batch * groups``).
      stages: the stages, in order.
      pretrained: variables the first stage starts from (None: a fresh initialisation).
      log_every: metrics cadence passed to ``Trainer.fit``.
      progress: a progress bar per stage (None: only when stderr is a terminal).
    """

    model: Any
    optimizer: Any
    key: jax.Array
    output: str | os.PathLike[str]
    batch: int
    stages: Sequence[Stage]
    pretrained: Mapping[str, Any] | None = None
    log_every: int | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        self.stages = tuple(self.stages)
        if not self.stages:
            raise ValueError("Recipe.stages: expected at least one Stage")
        for i, stage in enumerate(self.stages):
            if not isinstance(stage, Stage):
                raise TypeError(f"Recipe.stages[{i}]: expected a Stage, got {type(stage).__name__}")
        names = [s.name for s in self.stages]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Recipe.stages: stage names must be distinct, repeated: {repeated}")
        if not is_int(self.batch) or self.batch < 1:
            raise ValueError(f"Recipe.batch: expected a positive int, got {self.batch!r}")

    def objective(self, stage: Stage, start: Mapping[str, Any] | None) -> tuple[Any, Any]:
        """The objective and rollout (None unless GRPO) a stage trains with."""
        data = stage.data
        if stage.kind == "sft":
            from dew.objectives.lm import LMObjective

            return (
                LMObjective(self.model, data.seq_len, pretrained=start, loss_role=Role.ASSISTANT),
                None,
            )
        if stage.kind == "dpo":
            from dew.objectives.rl.dpo import DPOObjective

            beta = DEFAULT_DPO_BETA if stage.beta is None else stage.beta
            return DPOObjective(self.model, data.seq_len - 1, beta=beta, pretrained=start), None
        from dew.objectives.rl.grpo import GRPOObjective
        from dew.objectives.rollouts.sampled import SampledRollout
        from dew.sampling import Sampling

        beta = DEFAULT_GRPO_BETA if stage.beta is None else stage.beta
        width = data.max_prompt_len + stage.max_new_tokens
        objective = GRPOObjective(self.model, width - 1, beta=beta, pretrained=start)
        assert stage.reward is not None
        rollout = SampledRollout(
            objective,
            stage.reward,
            groups=stage.groups,
            max_new_tokens=stage.max_new_tokens,
            sampling=Sampling(top_k=stage.sample),
        )
        return objective, rollout

    def run(self) -> list[Any]:
        """Train (or restore) every stage in order; returns each stage's final ``TrainState``."""
        from dew.trainer import Trainer

        output = Path(self.output)
        output.mkdir(parents=True, exist_ok=True)
        start = None if self.pretrained is None else jax.device_get(self.pretrained)
        states = []
        # every stage's data is read (and checked) before the first stage trains
        datasets = [stage.data.load(self.batch) for stage in self.stages]
        for index, stage in enumerate(self.stages):
            objective, rollout = self.objective(stage, start)
            trainer = Trainer(
                objective,
                self.optimizer(stage) if callable(self.optimizer) else self.optimizer,
                key=jax.random.fold_in(self.key, index),
                rollout=rollout,
                progress=self.progress,
            )
            state = trainer.fit(
                datasets[index],
                steps=stage.steps,
                log_every=self.log_every,
                run_dir=output / stage.name,
            )
            states.append(state)
            # host copy: the next stage's compiled steps donate their own device buffers
            start = jax.device_get(state.params)
        return states


__all__ = ["Recipe", "Stage"]

"""DAPO's dynamic sampling for the synchronous GRPO rollout: train only on groups with signal.

A group whose completions all scored the same has zero advantage everywhere (GRPO compares
siblings), so it adds no gradient and only dilutes the batch. ``DynamicSampling(groups,
max_draws)`` keeps the first ``groups`` groups whose scores differ, drawing the batch's
prompts again (with fresh keys) while fewer have been found, at most ``max_draws`` rounds.
Groups of one completion always count (verl keeps them). The trained batch is always
``groups`` groups: when the cap is reached first, uniform groups from the draws fill the
remainder (they train on nothing) and ``sampling/filled_groups`` counts them, where verl
raises instead; a run whose model has saturated its data keeps going and says so.

Differences from verl 0.9.1's DAPO trainer (``recipe/dapo``, ``algorithm.filter_groups``):
verl draws *new* prompts from the data loader for each extra round and filters on a chosen
metric; here the step's own prompts are drawn again (the Trainer hands the rollout one batch,
and its data position stays the checkpointed one), and the filter reads the reward
function's scores (verl's ``acc``), before any KL or overlong shaping. Oversampling prompts is
the config's choice: ``run.batch`` prompts are drawn per round, ``groups`` of them train.

Metrics (``last_metrics`` of the rollout): ``sampling/draws`` (rounds used),
``sampling/informative_share`` (groups with signal among those drawn) and
``sampling/filled_groups``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dew.checks import is_int

#: ``draw(key) -> (completions, scores)``: every prompt's ``size`` completions, prompt-major.
Draw = Callable[[jax.Array], tuple[list[Any], np.ndarray]]


class DynamicSampling:
    """Keep ``groups`` groups with signal, drawing at most ``max_draws`` rounds.

    Args:
      groups: groups (prompts) per trained batch, at most the prompts of a step's batch.
      max_draws: sampling rounds per step, >= 1 (verl's ``max_num_gen_batches``).
    """

    def __init__(self, groups: int, max_draws: int = 3) -> None:
        if not is_int(groups) or groups < 1:
            raise ValueError(
                f"dynamic_sampling_groups: expected a positive integer, got {groups!r}"
            )
        if not is_int(max_draws) or max_draws < 1:
            raise ValueError(
                f"dynamic_sampling_draws: expected a positive integer, got {max_draws!r}"
            )
        self.groups = int(groups)
        self.max_draws = int(max_draws)

    def collect(
        self, draw: Draw, key: jax.Array, prompts: int, size: int
    ) -> tuple[list[Any], np.ndarray, np.ndarray, dict[str, float]]:
        """``(completions, scores, prompt_rows, metrics)`` of the ``groups`` kept groups.

        ``completions`` and ``scores`` are group-major (``groups * size`` each),
        ``prompt_rows`` the batch row of each kept group.
        """
        if prompts < self.groups:
            raise ValueError(
                f"dynamic_sampling_groups: expected at most the {prompts} prompts of a step's "
                f"batch, got {self.groups}"
            )
        kept: list[tuple[int, list[Any], np.ndarray]] = []
        spare: list[tuple[int, list[Any], np.ndarray]] = []
        drawn_groups = rounds = 0
        while len(kept) < self.groups and rounds < self.max_draws:
            completions, scores = draw(key if rounds == 0 else jax.random.fold_in(key, rounds))
            rounds += 1
            for row in range(prompts):
                part = slice(row * size, (row + 1) * size)
                group = (row, completions[part], np.asarray(scores[part]))
                drawn_groups += 1
                informative = size == 1 or np.ptp(group[2]) > 0
                (kept if informative else spare).append(group)
                if len(kept) == self.groups:
                    break
        informative_count = len(kept)
        kept += spare[: self.groups - len(kept)]
        metrics = {
            "sampling/draws": float(rounds),
            "sampling/informative_share": informative_count / drawn_groups,
            "sampling/filled_groups": float(self.groups - informative_count),
        }
        completions = [c for _, group, _ in kept for c in group]
        scores = np.concatenate([s for _, _, s in kept]).astype(np.float32)
        rows = np.array([row for row, _, _ in kept], np.int64)
        return completions, scores, rows, metrics


__all__ = ["DynamicSampling"]

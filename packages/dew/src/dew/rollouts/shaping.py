"""Rewards shaped between scoring and the advantage: KL in the reward and DAPO's overlong term.

``KLInReward`` is verl's ``algorithm.use_kl_in_reward``: every sampled id is charged
``coefficient * kl`` where ``kl`` is the per-token KL estimate (verl's ``kl_penalty`` by name,
``"kl"``/k1 by default) between the policy that sampled the batch and the frozen reference.
GRPO sums a session's charges into its reward before the group advantage (verl's outcome
estimators sum the token rewards); PPO subtracts each charge from the reward of its action
before GAE. With ``target`` and ``horizon`` the coefficient adapts after every batch
(Ziegler et al. 2019, verl's ``AdaptiveKLController``), otherwise it stays fixed. Its one
piece of state, the coefficient, is what ``state_dict`` returns: the Trainer writes it into
each checkpoint and hands it back on resume, so a resumed run charges exactly what the
uninterrupted one would have.

``Overlong`` is DAPO's soft overlong punishment: a completion whose length (its end id
included) passes ``max_new_tokens - buffer`` loses up to ``penalty_factor`` of reward, on a
linear ramp that reaches the full amount at the budget.

Both report what they did in ``last_metrics`` (``reward/kl_penalty``, verl's
``actor/reward_kl_penalty``; ``reward/kl_coefficient``, the coefficient the batch was charged
with; ``reward/overlong_share``, the share of completions penalised), which the Trainer adds
to its log line.

References: verl 0.9.1 ``ray_trainer.apply_kl_penalty``, ``core_algos.AdaptiveKLController``,
``reward_manager/dapo.py``; the math is ``dew.rl.kl_reward``, ``adaptive_kl_coefficient`` and
``overlong_penalty``, pinned to those by the parity fixtures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from dew import rl
from dew.checks import is_int, is_real
from dew.rollouts.actions import action_order


class Overlong:
    """DAPO's overlong penalty for completions of a ``max_new_tokens`` budget.

    Args:
      buffer: tokens before the budget over which the penalty ramps, ``1..max_new_tokens``
        (checked by ``penalties`` against the budget it is given).
      penalty_factor: the penalty at the budget, >= 0 (verl's default 1.0).
    """

    def __init__(self, buffer: int, penalty_factor: float = 1.0) -> None:
        if not is_int(buffer) or buffer < 1:
            raise ValueError(f"overlong_buffer: expected a positive integer, got {buffer!r}")
        if not is_real(penalty_factor) or not 0 <= float(penalty_factor) < math.inf:
            raise ValueError(
                f"overlong_penalty: expected a finite number >= 0, got {penalty_factor!r}"
            )
        self.buffer = int(buffer)
        self.penalty_factor = float(penalty_factor)

    def penalties(self, lengths: Any, max_new_tokens: int) -> np.ndarray:
        """``[N]`` float32 penalties (<= 0) of completions of these lengths."""
        if self.buffer > max_new_tokens:
            raise ValueError(
                f"overlong_buffer: expected at most max_new_tokens ({max_new_tokens}), got "
                f"{self.buffer}"
            )
        got = rl.overlong_penalty(
            jnp.asarray(lengths, jnp.float32), max_new_tokens, self.buffer, self.penalty_factor
        )
        return np.asarray(got, np.float32)


class KLInReward:
    """A per-token KL charge on the rewards, with a fixed or adaptive coefficient.

    Args:
      coefficient: the starting coefficient (verl ``kl_ctrl.kl_coef``), > 0.
      estimator: the KL estimate by verl's name (``dew.rl.KL_ESTIMATORS``); verl's default
        for the reward is ``"kl"`` (k1).
      target: the KL the adaptive controller steers to (verl ``kl_ctrl.target_kl``); with
        ``horizon``, the coefficient adapts; None with ``horizon`` None keeps it fixed.
      horizon: samples over which the adaptive controller spreads a full correction.
    """

    def __init__(
        self,
        coefficient: float,
        estimator: str = "kl",
        target: float | None = None,
        horizon: float | None = None,
    ) -> None:
        if not is_real(coefficient) or not 0 < float(coefficient) < math.inf:
            raise ValueError(f"kl_in_reward: expected a finite number > 0, got {coefficient!r}")
        if estimator not in rl.KL_ESTIMATORS:
            raise ValueError(
                f"kl_in_reward_estimator: expected one of {', '.join(rl.KL_ESTIMATORS)}, got "
                f"{estimator!r}"
            )
        if (target is None) != (horizon is None):
            missing = "kl_horizon" if horizon is None else "kl_target"
            raise ValueError(
                f"{missing}: the adaptive controller needs kl_target and kl_horizon together "
                f"(neither: a fixed coefficient), got kl_target={target!r} and "
                f"kl_horizon={horizon!r}"
            )
        for name, value in (("kl_target", target), ("kl_horizon", horizon)):
            if value is not None and (not is_real(value) or not 0 < float(value) < math.inf):
                raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
        self.coefficient = float(coefficient)
        self.estimator = estimator
        self.target = None if target is None else float(target)
        self.horizon = None if horizon is None else float(horizon)

    @property
    def adaptive(self) -> bool:
        """Whether the coefficient follows the measured KL."""
        return self.target is not None

    def charges(
        self, batch: Mapping[str, Any], log_probs: Any, ref_log_probs: Any
    ) -> tuple[np.ndarray, float, int]:
        """``(charges [B, W], current_kl, episodes)`` of a packed batch, before any update.

        ``charges`` is ``coefficient * kl`` on every action (``response_mask > 0`` and
        ``session_index >= 0``), 0 elsewhere; ``current_kl`` is the mean over the batch's
        episodes of each episode's mean token KL (verl's ``current_kl``); ``episodes`` how
        many there were (the ``n_steps`` of the adaptive update).
        """
        rows, cols, episodes = action_order(batch)
        shape = np.asarray(batch["response_mask"]).shape
        charges = np.zeros(shape, np.float32)
        if rows.size == 0:
            return charges, 0.0, 0
        present, starts, counts = np.unique(episodes, return_index=True, return_counts=True)
        slot = np.arange(rows.size) - np.repeat(starts, counts)
        line = np.repeat(np.arange(present.size), counts)
        kl = rl.kl_penalty(
            jnp.asarray(log_probs, jnp.float32), jnp.asarray(ref_log_probs, jnp.float32),
            self.estimator,
        )  # fmt: skip
        grid = np.zeros((present.size, int(counts.max())), np.float32)
        mask = np.zeros(grid.shape, bool)
        grid[line, slot] = np.asarray(kl)[rows, cols]
        mask[line, slot] = True
        rewards, current_kl = rl.kl_reward(
            jnp.zeros(grid.shape, jnp.float32), jnp.asarray(grid), jnp.asarray(mask),
            self.coefficient,
        )  # fmt: skip
        charges[rows, cols] = -np.asarray(rewards)[line, slot]
        return charges, float(current_kl), int(present.size)

    def charge(
        self,
        batch: Mapping[str, Any],
        log_probs: Any,
        ref_log_probs: Any,
        metrics: dict[str, float],
    ) -> np.ndarray:
        """One batch's step: its ``[B, W]`` charges (``charges``), the KL and the coefficient
        it was charged with recorded in ``metrics``, then the controller's ``update``."""
        charges, current_kl, episodes = self.charges(batch, log_probs, ref_log_probs)
        metrics["reward/kl_penalty"] = current_kl
        metrics["reward/kl_coefficient"] = self.coefficient
        self.update(current_kl, episodes)
        return charges

    def update(self, current_kl: float, n_steps: int) -> None:
        """The controller's step after a batch (nothing for a fixed coefficient)."""
        if self.adaptive:
            assert self.target is not None and self.horizon is not None
            self.coefficient = rl.adaptive_kl_coefficient(
                self.coefficient, current_kl, n_steps, self.target, self.horizon
            )

    def state_dict(self) -> dict[str, float]:
        """The controller's state, JSON-ready (a float round-trips exactly through JSON)."""
        return {"coefficient": self.coefficient}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict``."""
        value = state.get("coefficient") if isinstance(state, Mapping) else None
        if not is_real(value) or not 0 <= float(value) < math.inf:
            raise ValueError(
                f"checkpoint extra.rollout.kl_in_reward.coefficient: expected a finite number "
                f">= 0, got {value!r}"
            )
        self.coefficient = float(value)


def reference_of(objective: Any) -> Any:
    """The frozen reference the KL charge reads: the policy the objective starts from."""
    scorer = getattr(objective, "policy_objective", objective)
    pretrained = getattr(scorer, "pretrained", None)
    if pretrained is None:
        raise ValueError(
            "kl_in_reward: needs a starting policy to charge the KL against (model.pretrained, "
            "or an earlier stage of a chain); this run starts from fresh weights"
        )
    return pretrained


__all__ = ["KLInReward", "Overlong", "reference_of"]

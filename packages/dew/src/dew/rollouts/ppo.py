"""PPO targets for packed episodes (GAE over each episode's actions) and ``PPORollout``.

A tool episode is several calls (turns); the packer may split them over several chains and
rows. ``episode_targets`` gathers every sampled id (an *action*) of each episode from the
packed ``[B, W]`` arrays, orders them as they were drawn (by ``call_index``, then by position
inside the call's chain), and runs verl 0.9.1's ``compute_gae_advantage_return``
(``dew.rl.gae``) over each episode as one sequence:

- the episode's reward sits on its last action, every other action has reward 0;
- the value after the last action is 0 (no bootstrap): an episode that completed has no
  future, which is the convention of the pinned verl GAE; truncated episodes are not
  trained (the caller leaves them out of the mask), so they never need a bootstrap;
- ``returns = A + V`` before whitening; the advantages are then whitened over the global set
  of actions (every trained action of the cohort, on every process), as verl whitens over
  its batch.

Several processes: ``PPORollout`` gathers the action columns and episode rewards of every
process (``joined``), scores the critic over the data mesh, and computes the targets of the
whole cohort on every process before keeping its own rows. Each process thus whitens with
the same mean and deviation, and any split of the same devices over processes gives the same
targets as one process holding them all.

Observations between calls are not actions and take no part: GAE walks straight from one
call's last action to the next call's first one, the way verl's GAE passes its running
values through observation tokens.

Edge cases: a cohort with no action at all gets zero advantages and returns (the objective's
weight is then 0 and the Trainer makes no update); a cohort with exactly one action is
refused, because the unbiased deviation of one value is undefined (verl raises there too).

``PPORollout(objective, episodes, gamma, lam)`` is the Trainer's ``rollout=`` hook for
``PPOObjective``: it lets an ``EpisodeRollout`` collect and pack one cohort with the policy
part of the Trainer's snapshot, scores the packed rows with the critic (``old_values``, the
value of the state before each id) and adds ``episode_targets``. The batch keeps every packed
column (``old_log_probs``, ``behavior_log_probs``, ``response_mask``, ``rewards`` ...); the
GRPO group advantages are replaced by the GAE ones, and ``old_values``, ``advantages`` and
``returns`` are ``[rows, width]`` like ``input_ids``. Such a batch can be kept and trained on
for several updates without sampling again (the old values and likelihoods stay the ones
recorded at collection). ``last_targets`` keeps the host copy of the latest batch's targets.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from dew.checks import is_real
from dew.mesh import data_mesh, global_batch
from dew.rl import gae
from dew.rollouts.actions import action_order


class SingleActionError(ValueError):
    """A cohort with exactly one trainable action: its whitened advantage is undefined."""


def _bucket(n: int) -> int:
    """The next power of two >= n (at least 1), so few GAE programs are compiled."""
    return 1 << max(0, int(n) - 1).bit_length()


@functools.partial(jax.jit, static_argnums=(3, 4))
def _gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float, lam: float
) -> tuple[jax.Array, jax.Array]:
    return gae(rewards, values, mask, gamma, lam)


def episode_targets(
    batch: Mapping[str, Any],
    values: Any,
    rewards: Any,
    gamma: float = 1.0,
    lam: float = 0.95,
    token_rewards: Any = None,
) -> dict[str, np.ndarray]:
    """GAE advantages (whitened) and returns of packed episodes, shaped like the batch.

    Args:
      batch: packed columns ``[B, W]``: ``response_mask`` (non-zero on trained actions),
        ``session_index`` (the episode of each action, -1 elsewhere), ``call_index`` and
        ``text_positions``.
      values: ``[B, W]`` critic values of the state before each id (``old_values``).
      rewards: ``[S]`` episode rewards, indexed by ``session_index``.
      gamma: discount per action.
      lam: GAE lambda.
      token_rewards: optional ``[B, W]`` rewards added to each action's own (the KL charges
        of ``dew.rollouts.shaping.KLInReward``, negated), verl's token-level rewards.

    Returns:
      ``{"advantages", "returns"}``, float32 ``[B, W]``, 0 off the actions.

    Raises:
      SingleActionError: the batch holds exactly one action.
    """
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not is_real(value):
            raise TypeError(f"{name}: expected a float in [0, 1], got {value!r}")
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name}: expected a float in [0, 1], got {value!r}")
    rows, cols, episodes = action_order(batch)
    shape = np.asarray(batch["response_mask"]).shape
    values = np.asarray(values)
    if values.shape != shape:
        raise ValueError(
            f"values: expected shape {shape} aligned with the batch, got {values.shape}"
        )
    rewards = np.asarray(rewards, np.float64).reshape(-1)
    advantages = np.zeros(shape, np.float32)
    returns = np.zeros(shape, np.float32)
    if rows.size == 0:
        return {"advantages": advantages, "returns": returns}
    if rows.size == 1:
        raise SingleActionError(
            "response_mask: the cohort holds exactly one trainable action token "
            f"(row {rows[0]}, column {cols[0]}); its advantage cannot be whitened (the unbiased "
            "deviation of one value is undefined). Sample more actions per update."
        )
    if episodes.max() >= rewards.size:
        raise ValueError(
            f"rewards: expected one reward per episode, {int(episodes.max()) + 1} or more, "
            f"got {rewards.size}"
        )
    if not np.all(np.isfinite(values[rows, cols])):
        raise ValueError("values: expected finite critic values on every action, got nan or inf")
    present, starts, counts = np.unique(episodes, return_index=True, return_counts=True)
    if not np.all(np.isfinite(rewards[present])):
        raise ValueError("rewards: expected a finite reward for every trained episode")
    slot = np.arange(rows.size) - np.repeat(starts, counts)  # action index inside its episode
    line = np.repeat(np.arange(present.size), counts)  # compact row of each action
    height, length = _bucket(present.size), _bucket(int(counts.max()))
    compact_values = np.zeros((height, length), np.float32)
    compact_rewards = np.zeros((height, length), np.float32)
    compact_mask = np.zeros((height, length), bool)
    compact_values[line, slot] = values[rows, cols]
    compact_mask[line, slot] = True
    compact_rewards[np.arange(present.size), counts - 1] = rewards[present].astype(np.float32)
    if token_rewards is not None:
        compact_rewards[line, slot] += np.asarray(token_rewards, np.float32)[rows, cols]
    adv, ret = jax.device_get(
        _gae(
            jnp.asarray(compact_rewards),
            jnp.asarray(compact_values),
            jnp.asarray(compact_mask),
            float(gamma),
            float(lam),
        )
    )
    advantages[rows, cols] = np.asarray(adv)[line, slot]
    returns[rows, cols] = np.asarray(ret)[line, slot]
    return {"advantages": advantages, "returns": returns}


ACTION_COLUMNS = ("response_mask", "session_index", "call_index", "text_positions")


def joined(columns: Mapping[str, Any], rewards: Any) -> dict[str, np.ndarray]:
    """The cohort over every process: each ``[B, W]`` column and ``rewards`` concatenated in
    process order (this process's own arrays when it is the only one).

    ``session_index`` must number the episodes of the whole cohort, process by process (as
    ``EpisodeRollout`` does): process ``r``'s ``rewards[i]`` is episode ``r * len(rewards) + i``.
    """
    local = {name: np.asarray(value) for name, value in columns.items()}
    local["rewards"] = np.asarray(rewards, np.float32).reshape(-1)
    count = jax.process_count()
    if count == 1:
        return local
    every = {
        k: np.asarray(v) for k, v in multihost_utils.process_allgather(local, tiled=True).items()
    }
    size = local["rewards"].size
    index = every["session_index"].reshape(count, -1)
    for rank in range(count):
        mine = index[rank][index[rank] >= 0]
        if mine.size and (mine.min() < rank * size or mine.max() >= (rank + 1) * size):
            raise ValueError(
                f"session_index: expected process {rank}'s episodes in [{rank * size}, "
                f"{(rank + 1) * size}) (numbered over the cohort), got {mine.min()}..{mine.max()}"
            )
    return every


def own_rows(array: np.ndarray) -> np.ndarray:
    """This process's rows of an array joined over processes in process order."""
    rows = array.shape[0] // jax.process_count()
    return array[jax.process_index() * rows : (jax.process_index() + 1) * rows]


class PPORollout:
    """Collect episodes, evaluate the critic and add GAE targets (see the module docstring).

    Args:
      objective: the ``PPOObjective`` being trained.
      episodes: an ``EpisodeRollout`` (any ``(variables, batch, key) -> packed batch`` whose
        batch carries ``session_index``, ``call_index`` and per-episode ``rewards``). Build
        it with ``objective.policy(variables)`` (or any sampler of the policy alone): it
        receives the policy subtree of the Trainer's snapshot.
      gamma: discount per action, in [0, 1].
      lam: GAE lambda, in [0, 1].
      kl_in_reward: ``dew.rollouts.shaping.KLInReward``: each action's reward loses its KL
        charge against the objective's starting policy before GAE (verl's
        ``use_kl_in_reward``); needs ``objective.pretrained``.
    """

    def __init__(
        self,
        objective: Any,
        episodes: Any,
        gamma: float = 1.0,
        lam: float = 0.95,
        kl_in_reward: Any = None,
    ):
        for name in ("packed_values", "policy_variables"):
            if not callable(getattr(objective, name, None)):
                raise TypeError(f"objective: expected a PPOObjective, it has no {name!r}")
        if not callable(episodes):
            raise TypeError(
                f"episodes: expected an EpisodeRollout (a callable (variables, batch, key) -> "
                f"packed batch), got {type(episodes).__name__}"
            )
        for name, value in (("gamma", gamma), ("lam", lam)):
            if not is_real(value):
                raise TypeError(f"{name}: expected a float in [0, 1], got {value!r}")
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name}: expected a float in [0, 1], got {value!r}")
        width = getattr(episodes, "width", None)
        if width is not None and width != objective.width:
            raise ValueError(
                f"objective.seq_len: the episodes pack rows {width} wide, so expected "
                f"PPOObjective(seq_len={width - 1}), got seq_len={objective.width - 1}"
            )
        self.objective = objective
        self.episodes = episodes
        self.gamma = float(gamma)
        self.lam = float(lam)
        self._values = jax.jit(objective.packed_values)
        self._mesh: Any = None
        self.last_targets: dict[str, np.ndarray] = {}
        self.last_metrics: dict[str, float] = {}
        self.kl_in_reward = kl_in_reward
        if kl_in_reward is not None:
            from dew.rollouts.shaping import reference_of

            self._reference = reference_of(objective)
            self._log_probs = jax.jit(objective.packed_log_probs)
            self._reference_log_probs = jax.jit(objective.policy_objective.packed_log_probs)

    def at_step(self, step: int, updates: int) -> None:
        """Pass the Trainer's clocks on to the episode collector."""
        at_step = getattr(self.episodes, "at_step", None)
        if at_step is not None:
            at_step(step, updates)

    def __call__(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, Any]:
        """One cohort: collect, pack, evaluate the critic, add ``old_values`` and GAE targets."""
        out = dict(self.episodes(self.objective.policy_variables(variables), batch, key))
        if "rewards" not in out:
            raise KeyError("episodes: the packed batch has no 'rewards' (one per episode)")
        rows = {k: out[k] for k in ("input_ids", "text_segment_ids", "text_positions")}
        trained = (np.asarray(out["response_mask"]) > 0) & (np.asarray(out["session_index"]) >= 0)
        if "old_log_probs" not in out and not trained.any():
            # nothing was packed (every episode truncated): keep the batch's shape for a
            # step that makes no update
            out["old_log_probs"] = np.zeros(trained.shape, np.float32)
        cohort = joined({k: out[k] for k in ACTION_COLUMNS}, out["rewards"])
        every = (cohort["response_mask"] > 0) & (cohort["session_index"] >= 0)
        cohort["old_values"] = np.where(every, self._scored(self._values, variables, rows), 0.0)
        cohort["old_values"] = cohort["old_values"].astype(np.float32)
        metrics = dict(getattr(self.episodes, "last_metrics", None) or {})
        token_rewards = None
        if self.kl_in_reward is not None and every.any():
            token_rewards = -self._kl_charges(variables, cohort, rows, metrics)
        targets = episode_targets(cohort, cohort["old_values"], cohort["rewards"], self.gamma,
                                  self.lam, token_rewards=token_rewards)  # fmt: skip
        out["old_values"] = own_rows(cohort["old_values"])
        out.update({name: own_rows(value) for name, value in targets.items()})
        self.last_targets = {k: out[k] for k in ("old_values", "advantages", "returns")}
        self.last_metrics = metrics
        return out

    def _scored(self, score: Any, variables: Any, rows: Mapping[str, Any]) -> np.ndarray:
        """``score(variables, rows)`` as float32 over every process's rows, in process order.

        With more than one device the rows are split over the data mesh (the Trainer's
        layout), so every split of the same devices over processes runs one program."""
        if jax.device_count() == 1:
            return np.asarray(jax.device_get(score(variables, rows)), np.float32)
        if self._mesh is None:
            self._mesh = data_mesh()
        scored = score(variables, global_batch(rows, self._mesh))
        if jax.process_count() == 1:
            return np.asarray(jax.device_get(scored), np.float32)
        return np.asarray(multihost_utils.process_allgather(scored, tiled=True), np.float32)

    def _kl_charges(
        self,
        variables: Mapping[str, Any],
        cohort: Mapping[str, Any],
        rows: Mapping[str, Any],
        metrics: dict[str, float],
    ) -> np.ndarray:
        """``[B, W]`` KL charges of the cohort's actions (every process's rows); steps the
        controller, which then moves alike on every process."""
        log_probs = self._scored(self._log_probs, variables, rows)
        ref_log_probs = self._scored(self._reference_log_probs, self._reference, rows)
        return self.kl_in_reward.charge(cohort, log_probs, ref_log_probs, metrics)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rollout: the KL controller's state and the
        sampler's (its correction bounds), if any."""
        state = dict(getattr(self.episodes, "state_dict", dict)())
        if self.kl_in_reward is not None:
            state["kl_in_reward"] = self.kl_in_reward.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``'s output (a checkpoint without a part leaves it)."""
        if self.kl_in_reward is not None and "kl_in_reward" in state:
            self.kl_in_reward.load_state_dict(state["kl_in_reward"])
        load = getattr(self.episodes, "load_state_dict", None)
        if callable(load):
            load({k: v for k, v in state.items() if k != "kl_in_reward"})


__all__ = ["PPORollout", "SingleActionError", "action_order", "episode_targets"]

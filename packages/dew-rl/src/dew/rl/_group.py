"""Group-relative advantages of outcome rewards: GRPO, Dr.GRPO, RLOO, and ragged groups.

Each completion's scalar reward ``[B]`` is compared with the other completions of its prompt.
``group_advantage`` and ``rloo_advantage`` take groups as adjacent runs of one size (a
reshape to ``[B / group, group]``); ``ragged_group_advantage`` takes groups named by integer
ids, of any size, in any order, with dropped members masked out. The token-level advantages
(GAE, whitening) live in ``_gae``.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates)
# and Tunix (Apache License 2.0, Copyright 2025 Google LLC).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import is_python_number, require_float, require_rank, require_same_shape
from dew.rl._masking import at_least_float32, keep_of, select

#: verl's ``epsilon`` default in ``compute_grpo_outcome_advantage``.
GROUP_EPS = 1e-6


def _check_groups(rewards: jax.Array, group: int) -> None:
    """Raise unless ``rewards`` is ``[B]`` floats and ``group`` divides ``B``."""
    require_float("rewards", rewards)
    require_rank("rewards", rewards, 1, "[B]")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group: expected a positive Python int, got {group!r}")
    if rewards.shape[0] % group:
        raise ValueError(
            f"rewards: expected a length divisible by group={group}, got {rewards.shape[0]}"
        )


def group_advantage(
    rewards: jax.Array,
    group: int,
    normalise_by_std: bool = True,
    eps: float = GROUP_EPS,
    ddof: int = 1,
) -> jax.Array:
    """GRPO's advantage: each reward against its group's mean, over the group's deviation.

    Port of verl 0.9.1 ``compute_grpo_outcome_advantage`` for outcome rewards. The rollout
    lays the ``group`` completions of one prompt next to each other, so groups are a
    reshape of ``[B]`` into ``[B / group, group]``; for groups of different sizes, in any
    order or with dropped members, use :func:`ragged_group_advantage`. The deviation is unbiased
    (``torch.std``): ``(r - mean) / (std + eps)``. ``normalise_by_std=False`` is Dr.GRPO
    (arXiv:2503.20783), ``r - mean``; verl calls that switch
    ``norm_adv_by_std_in_grpo``.

    ``ddof`` picks the deviation's estimator, and with it the reference followed:

    - ``ddof=1`` (default): the unbiased deviation, ``sqrt(sum((r - mean)**2) / (G - 1))``,
      as verl 0.9.1 (``torch.std``) computes it for LLM GRPO;
    - ``ddof=0``: the population deviation, ``sqrt(sum((r - mean)**2) / G)``, as Flow-GRPO
      (github.com/yifan123/flow_grpo, ``flow_grpo/stat_tracking.py``,
      ``PerPromptStatTracker.update`` with ``np.std``) normalises image groups; Flow-GRPO
      adds ``eps=1e-4`` and works in float64, so pass ``eps=1e-4`` and float64 rewards
      (under ``jax.enable_x64``) to reproduce it.

    Edge cases: a group with zero spread gives zeros. A group of one follows the
    reference that ``ddof`` names. With ``ddof=1`` (verl) it has mean 0 and deviation 1,
    so its advantage is ``r / (1 + eps)`` (just ``r`` without the deviation); verl adds
    that ``1 + eps`` in float32, and so does this. With ``ddof=0`` (Flow-GRPO) the group
    is its own mean and the advantage is 0. ``group``, ``normalise_by_std`` and ``ddof``
    are static under ``jax.jit``.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group: completions per prompt (a Python int dividing ``B``).
      normalise_by_std: divide by the group deviation (GRPO) or not (Dr.GRPO).
      eps: added to the deviation, verl's ``epsilon`` (Flow-GRPO uses 1e-4).
      ddof: 1 for the unbiased deviation (verl), 0 for the population deviation
        (Flow-GRPO).

    Returns:
      ``[B]`` advantages in the rewards' dtype; broadcast over tokens with
      ``adv[:, None]`` and mask there.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> import numpy as np
      >>> rewards = jnp.array([1.0, 0.0, 1.0, 0.5, 0.5, 0.5])  # two prompts, three each
      >>> print(np.asarray(rl.group_advantage(rewards, group=3)).round(3))
      [ 0.577 -1.155  0.577  0.     0.     0.   ]
      >>> print(np.asarray(rl.group_advantage(rewards, 3, normalise_by_std=False)).round(3))
      [ 0.333 -0.667  0.333  0.     0.     0.   ]

    References:
      Shao et al., `DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
      Language Models <https://arxiv.org/abs/2402.03300>`_, 2024 (GRPO).

      Liu et al., `Understanding R1-Zero-Like Training: A Critical Perspective
      <https://arxiv.org/abs/2503.20783>`_, 2025 (Dr.GRPO).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_grpo_outcome_advantage``.

      Liu et al., `Flow-GRPO: Training Flow Matching Models via Online RL
      <https://arxiv.org/abs/2505.05470>`_, 2025 (the population deviation, ``ddof=0``).
    """
    _check_groups(rewards, group)
    if isinstance(ddof, bool) or not isinstance(ddof, int) or ddof not in (0, 1):
        raise ValueError(
            f"ddof: expected 1 (unbiased deviation, verl) or 0 (population deviation, "
            f"Flow-GRPO), got {ddof!r}"
        )
    grouped = rewards.reshape(-1, group)
    if group == 1 and ddof == 1:
        if not normalise_by_std:
            return rewards
        scale = (jnp.float32(1.0) + jnp.float32(eps)).astype(rewards.dtype)
        return rewards / scale
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    centred = grouped - mean
    if normalise_by_std:
        std = jnp.std(grouped, axis=1, keepdims=True, ddof=ddof)
        centred = centred / (std + eps)
    return centred.reshape(-1)


def rloo_advantage(rewards: jax.Array, group: int) -> jax.Array:
    """Each completion's reward minus the mean reward of the rest of its group.

    ``r_i - mean_{j != i} r_j`` (arXiv:2402.14740), computed in that leave-one-out form as
    Tunix does; it equals ``group / (group - 1)`` times the centred reward
    ``r_i - mean_j r_j``, the form verl 0.9.1 ``compute_rloo_outcome_advantage`` writes
    (the two differ only in rounding). Groups are adjacent runs of ``group`` rewards, as
    in :func:`group_advantage`.

    A group of one has no other completion to compare with; like verl's ``rloo``
    estimator, its reward is returned unchanged (the empty baseline counts as 0).
    ``group`` is static under ``jax.jit``.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group: completions per prompt (a Python int dividing ``B``).

    Returns:
      ``[B]`` advantages in the rewards' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> rewards = jnp.array([1.0, 0.0, 1.0, 3.0, 1.0, 2.0])
      >>> print(rl.rloo_advantage(rewards, group=3))
      [ 0.5 -1.   0.5  1.5 -1.5  0. ]

    References:
      Ahmadian et al., `Back to Basics: Revisiting REINFORCE Style Optimization for
      Learning from Human Feedback in LLMs <https://arxiv.org/abs/2402.14740>`_, 2024.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_rloo_outcome_advantage``.
    """
    _check_groups(rewards, group)
    if group == 1:
        return rewards
    grouped = rewards.reshape(-1, group)
    others = jnp.sum(grouped, axis=1, keepdims=True) - grouped
    baseline = others / (group - 1)
    return (grouped - baseline).reshape(-1)


#: The estimators of :func:`ragged_group_advantage`, by verl's names for them.
ESTIMATORS = ("group", "mean", "rloo")


def ragged_group_advantage(
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: jax.Array | None = None,
    estimator: str = "group",
    eps: float = GROUP_EPS,
) -> jax.Array:
    """Group-relative advantages for groups of any size, named by ids, members anywhere.

    Packing several prompts' completions into one batch makes ragged groups: prompts with
    different numbers of completions, groups of one, members that were dropped (a
    cancelled or truncated sample) and members in any order. Here a group is the set of
    kept entries that share an integer id, wherever they sit, and each kept entry is
    compared with its own group (verl 0.9.1 ``compute_grpo_outcome_advantage`` and
    ``compute_rloo_outcome_advantage`` group the same way through their ``index``):

    - ``"group"`` (GRPO): ``(r - mean) / (std + eps)`` with the unbiased deviation;
    - ``"mean"`` (Dr.GRPO, verl's ``norm_adv_by_std_in_grpo=False``): ``r - mean``;
    - ``"rloo"``: ``r - mean`` of the group's other members, in the leave-one-out form
      of :func:`rloo_advantage`.

    A group of one has mean 0 and deviation 1, as in verl: ``"group"`` gives
    ``r / (1 + eps)`` (that sum formed in float32, as verl forms it), ``"mean"`` and
    ``"rloo"`` give ``r``. A group whose rewards are equal gets zeros. Entries outside
    ``mask`` belong to no group, take no part in any statistic and get 0; whatever they
    hold (nan included) reaches nothing. On adjacent groups of one size this is
    :func:`group_advantage` (``"group"``, ``"mean"``) or :func:`rloo_advantage`
    (``"rloo"``), up to the order of the summation.

    Ids may be any integers (task numbers, hashes, a prompt's position); they are ranked
    inside the function, so it jits with ``estimator`` static and everything else traced.
    Statistics are formed in at least float32.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group_ids: ``[B]`` integer group of each completion.
      mask: optional ``[B]``; non-zero keeps a completion, default all kept.
      estimator: ``"group"``, ``"mean"`` or ``"rloo"``.
      eps: added to a group's deviation (``"group"`` only), verl's ``epsilon``.

    Returns:
      ``[B]`` advantages in the rewards' dtype, 0 where ``mask`` drops a completion.

    Examples:
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import dew.rl as rl
      >>> rewards = jnp.array([1.0, 3.0, 0.0, 5.0, 2.0, jnp.nan])
      >>> group_ids = jnp.array([7, 4, 7, 4, 9, 7])
      >>> mask = jnp.array([1, 1, 1, 1, 1, 0])  # the last completion was dropped
      >>> # kept groups: 7 holds 1 and 0, 4 holds 3 and 5, 9 holds 2 alone
      >>> print(rl.ragged_group_advantage(rewards, group_ids, mask, "mean"))
      [ 0.5 -1.  -0.5  1.   2.   0. ]
      >>> print(rl.ragged_group_advantage(rewards, group_ids, mask, "rloo"))
      [ 1. -2. -1.  2.  2.  0.]
      >>> print(np.asarray(rl.ragged_group_advantage(rewards, group_ids, mask)).round(4))
      [ 0.7071 -0.7071 -0.7071  0.7071  2.      0.    ]

    References:
      Shao et al., `DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
      Language Models <https://arxiv.org/abs/2402.03300>`_, 2024 (GRPO).

      Ahmadian et al., `Back to Basics: Revisiting REINFORCE Style Optimization for
      Learning from Human Feedback in LLMs <https://arxiv.org/abs/2402.14740>`_, 2024
      (RLOO).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_grpo_outcome_advantage``
      and ``compute_rloo_outcome_advantage``.
    """
    require_float("rewards", rewards)
    require_rank("rewards", rewards, 1, "[B]")
    require_rank("group_ids", group_ids, 1, "[B]")
    require_same_shape("group_ids", group_ids, "rewards", rewards)
    if not jnp.issubdtype(jnp.result_type(group_ids), jnp.integer):
        raise TypeError(
            f"group_ids: expected integer group ids, got dtype {jnp.result_type(group_ids)}"
        )
    if mask is not None:
        require_same_shape("mask", mask, "rewards", rewards)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {estimator!r}")
    if is_python_number(eps) and not float(eps) >= 0.0:  # type: ignore[arg-type]
        raise ValueError(f"eps: expected a non-negative number, got {eps}")
    size = rewards.shape[0]
    if size == 0:
        return rewards
    dtype = at_least_float32(rewards.dtype)
    keep = jnp.ones((size,), jnp.bool_) if mask is None else keep_of(mask)
    x = select(rewards, keep).astype(dtype)
    # Rank the ids: slot[i] is the group's index among the distinct ids, in [0, B).
    _, slot = jnp.unique(group_ids, size=size, return_inverse=True)
    slot = slot.reshape(size)

    def group_sum(values: jax.Array) -> jax.Array:
        """Each entry gets the sum of ``values`` over its group's kept members."""
        return jax.ops.segment_sum(select(values, keep), slot, num_segments=size)[slot]

    n = group_sum(jnp.ones((size,), dtype))
    total = group_sum(x)
    shared = n > 1  # a group of one has no baseline (mean 0, deviation 1)
    if estimator == "rloo":
        others = (total - x) / jnp.maximum(n - 1, 1)
        advantages = jnp.where(shared, x - others, x)
    else:
        mean = jnp.where(shared, total / jnp.maximum(n, 1), jnp.zeros((), dtype))
        advantages = x - mean
        if estimator == "group":
            std = jnp.sqrt(group_sum(advantages**2) / jnp.maximum(n - 1, 1))
            alone = (jnp.float32(1.0) + jnp.asarray(eps, jnp.float32)).astype(dtype)
            advantages = advantages / jnp.where(shared, std + eps, alone)
    return select(advantages, keep).astype(rewards.dtype)

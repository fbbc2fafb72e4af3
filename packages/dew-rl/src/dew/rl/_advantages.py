"""Advantages: generalized advantage estimation, whitening, group-relative baselines."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates)
# and Tunix (Apache License 2.0, Copyright 2025 Google LLC).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    is_python_number,
    require_float,
    require_rank,
    require_same_dtype,
    require_same_shape,
)
from dew.rl._masking import (
    at_least_float32,
    count_dtype,
    count_kept,
    keep_of,
    mean_with_eps,
    select,
)

#: verl's ``epsilon`` default in ``compute_grpo_outcome_advantage``.
GROUP_EPS = 1e-6
#: verl adds this to the variance before the reciprocal square root.
WHITEN_EPS = 1e-8


def gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation (arXiv:1506.02438) over ``[B, T]`` steps.

    Port of verl 0.9.1 ``compute_gae_advantage_return``. Walking backwards from the last
    step, ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam *
    A_next``. A step outside the mask contributes nothing: it passes the running advantage
    and the next value through unchanged, so a padded tail (or observation tokens inside a
    multi-turn episode) leaves the kept steps exactly as if it were absent. Positions
    outside the mask hold the carried advantage, for the loss to mask again.

    ``returns = A + V`` is taken before whitening; the advantages are then whitened with
    :func:`masked_whiten`. Everything runs in at least float32 (bfloat16 or float16 input
    is upcast and float32 comes back; float64 stays float64), and nothing here carries a
    gradient (verl runs it under ``torch.no_grad``). Selection is done with ``jnp.where``,
    so a nan in a masked reward or value cannot reach a kept step.

    Args:
      token_rewards: ``[B, T]`` per-step rewards.
      values: ``[B, T]`` critic values at rollout time, same dtype.
      mask: ``[B, T]``; non-zero marks a real (response) step.
      gamma: discount factor.
      lam: GAE lambda.

    Returns:
      ``(advantages, returns)``: whitened advantages and unwhitened returns, both
      ``[B, T]`` in ``promote(dtype, float32)``. With exactly one kept step in the batch
      the whitening divides by zero and the advantages are nan (see
      :func:`masked_whiten`).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
      >>> values = jnp.array([[0.5, 0.5, 0.5], [0.2, 0.4, 0.0]])
      >>> mask = jnp.array([[1, 1, 1], [1, 1, 0]])  # the second row ends one step early
      >>> advantages, returns = rl.gae(rewards, values, mask, gamma=1.0, lam=1.0)
      >>> print(returns)  # undiscounted: the reward still to come (0 past the end)
      [[1. 1. 1.]
       [1. 1. 0.]]
      >>> print(advantages.shape)  # whitened over the five kept steps
      (2, 3)

    References:
      Schulman et al., `High-Dimensional Continuous Control Using Generalized Advantage
      Estimation <https://arxiv.org/abs/1506.02438>`_, 2016.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_gae_advantage_return``.
    """
    require_float("token_rewards", token_rewards)
    require_rank("token_rewards", token_rewards, 2, "[B, T]")
    require_same_shape("values", values, "token_rewards", token_rewards)
    require_same_dtype("values", values, "token_rewards", token_rewards)
    require_same_shape("mask", mask, "token_rewards", token_rewards)
    dtype = at_least_float32(token_rewards.dtype)
    rewards = jax.lax.stop_gradient(token_rewards).astype(dtype)
    values = jax.lax.stop_gradient(values).astype(dtype)
    keep = keep_of(mask)
    decay = gamma * lam

    # The carry holds the next value and the next advantage already multiplied by gamma
    # and by gamma * lam. Each product is then rounded and stored before the next step adds
    # it, so XLA cannot contract the product and the sum into one fused multiply-add,
    # which rounds once where torch rounds twice.
    def step(
        carry: tuple[jax.Array, jax.Array, jax.Array],
        inputs: tuple[jax.Array, jax.Array, jax.Array],
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], jax.Array]:
        discounted_value, discounted_advantage, last_advantage = carry
        reward, value, kept = inputs
        delta = reward + discounted_value - value
        advantage = delta + discounted_advantage
        discounted_value = jnp.where(kept, gamma * value, discounted_value)
        discounted_advantage = jnp.where(kept, decay * advantage, discounted_advantage)
        last_advantage = jnp.where(kept, advantage, last_advantage)
        return (discounted_value, discounted_advantage, last_advantage), last_advantage

    batch = rewards.shape[0]
    zeros = jnp.zeros((batch,), dtype)
    _, advantages = jax.lax.scan(
        step, (zeros, zeros, zeros), (rewards.T, values.T, keep.T), reverse=True
    )
    advantages = advantages.T
    returns = advantages + values
    return _whiten(advantages, mask), returns


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Centre ``x`` on its masked mean and divide by its masked, Bessel-corrected deviation.

    Port of verl 0.9.1 ``verl.utils.torch_functional.masked_whiten`` with ``masked_var``
    (``unbiased=True``): ``(x - mean) * rsqrt(var * n / (n - 1) + 1e-8)``, where the mean
    and the variance are :func:`masked_mean` over all axes and ``n`` is the kept count.
    verl's ``n / (n - 1)`` divides two int64 tensors, which torch does in float32; that is
    reproduced, so float64 input matches verl bit for bit.

    The arithmetic runs in at least float32: bfloat16 or float16 input is upcast and the
    result stays float32 (the centring subtracts close numbers that half precision would
    round to zero). float64 stays float64.

    Edge cases, which verl refuses with an exception and a jitted function cannot:
    one kept position gives 0 * inf = nan everywhere; no kept position gives ``x * 1e4``.
    Positions outside the mask are whitened with the same statistics and left in the
    output for the caller to mask again.

    Args:
      x: ``[B, T]`` (any shape) floating values.
      mask: same shape; non-zero keeps a position.

    Returns:
      Same shape as ``x``, dtype ``promote(x.dtype, float32)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> import numpy as np
      >>> x = jnp.array([[1.0, 2.0, 3.0, 100.0]])
      >>> mask = jnp.array([[True, True, True, False]])  # 100.0 is padding
      >>> print(np.asarray(rl.masked_whiten(x, mask)[:, :3]).round(3))  # deviation 1
      [[-1.  0.  1.]]

    References:
      verl 0.9.1, ``verl/utils/torch_functional.py``, ``masked_whiten`` and ``masked_var``.
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    return _whiten(x, mask)


def _whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """:func:`masked_whiten` without the argument checks."""
    x = x.astype(at_least_float32(x.dtype))
    keep = keep_of(mask)
    mean = mean_with_eps(x, mask)
    centred = x - mean
    variance = mean_with_eps(centred**2, mask)
    n = count_kept(keep)
    cdtype = count_dtype(mask)
    bessel = n.astype(cdtype) / (n - 1).astype(cdtype)
    variance = variance * bessel.astype(x.dtype)
    return centred * jax.lax.rsqrt(variance + jnp.asarray(WHITEN_EPS, x.dtype))


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
) -> jax.Array:
    """GRPO's advantage: each reward against its group's mean, over the group's deviation.

    Port of verl 0.9.1 ``compute_grpo_outcome_advantage`` for outcome rewards. The rollout
    lays the ``group`` completions of one prompt next to each other, so groups are a
    reshape of ``[B]`` into ``[B / group, group]``; for groups of different sizes, in any
    order or with dropped members, use :func:`ragged_group_advantage`. The deviation is unbiased
    (``torch.std``): ``(r - mean) / (std + eps)``. ``normalise_by_std=False`` is Dr.GRPO
    (arXiv:2503.20783), ``r - mean``; verl calls that switch
    ``norm_adv_by_std_in_grpo``.

    Edge cases, as in verl: a group with zero spread gives zeros; a group of one has mean
    0 and deviation 1, so its advantage is ``r / (1 + eps)`` (just ``r`` without the
    deviation); verl adds that ``1 + eps`` in float32, and so does this. ``group`` and
    ``normalise_by_std`` are static under ``jax.jit``.

    Args:
      rewards: ``[B]`` one scalar reward per completion.
      group: completions per prompt (a Python int dividing ``B``).
      normalise_by_std: divide by the group deviation (GRPO) or not (Dr.GRPO).
      eps: added to the deviation, verl's ``epsilon``.

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
    """
    _check_groups(rewards, group)
    grouped = rewards.reshape(-1, group)
    if group == 1:
        if not normalise_by_std:
            return rewards
        scale = (jnp.float32(1.0) + jnp.float32(eps)).astype(rewards.dtype)
        return rewards / scale
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    centred = grouped - mean
    if normalise_by_std:
        std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)
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

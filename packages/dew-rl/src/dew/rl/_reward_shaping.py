"""Rewards shaped before the advantage: a KL charge per token, its adaptive coefficient, and
DAPO's soft penalty for responses that run into the length budget.

These act on rewards, not on the loss: the trainer applies them between scoring and the
advantage estimator, so a GRPO group or PPO's GAE sees the shaped numbers.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dew.rl._checks import is_python_number, require_float, require_rank, require_same_shape
from dew.rl._masking import keep_of, mean_with_eps, select

#: verl bounds the adaptive controller's proportional error to this magnitude per update.
ADAPTIVE_KL_ERROR_BOUND = 0.2


def kl_reward(
    token_scores: jax.Array, kl: jax.Array, mask: jax.Array, beta: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Token rewards charged ``beta`` times a per-token KL, and the batch's mean KL.

    Port of verl 0.9.1 ``apply_kl_penalty`` (``algorithm.use_kl_in_reward``):
    ``rewards = scores - beta * kl * mask`` and ``current_kl``, the mean over rows of each
    row's masked token mean of ``kl`` (verl's ``masked_mean`` with its ``+ 1e-8``, so a row
    with no kept token counts as 0 in the mean over rows). ``current_kl`` is what an
    adaptive controller (:func:`adaptive_kl_coefficient`) reads next.

    An outcome reward sits on the last kept token of ``token_scores``; the estimator the
    charge uses is the caller's (verl's default is ``"kl"``, k1:
    ``kl_penalty(old_log_probs, ref_log_probs, "kl")``). GRPO's outcome estimators sum the
    token rewards of a sequence, so there the charge lowers each sequence's reward by
    ``beta`` times its summed KL.

    Args:
      token_scores: ``[B, T]`` rewards per token before the charge (zeros except where the
        outcome sits).
      kl: ``[B, T]`` per-token KL between the sampling policy and the reference, same dtype.
      mask: ``[B, T]`` response tokens (boolean or numeric); masked tokens are not charged.
      beta: the coefficient (a Python number or a scalar array).

    Returns:
      ``(rewards [B, T], current_kl scalar)`` in the scores' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> scores = jnp.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
      >>> kl = jnp.array([[0.5, 0.5, 0.5], [1.0, 1.0, 7.0]])
      >>> mask = jnp.array([[1, 1, 1], [1, 1, 0]])
      >>> rewards, current_kl = rl.kl_reward(scores, kl, mask, 0.1)
      >>> print(rewards)
      [[-0.05 -0.05  0.95]
       [-0.1   0.9   0.  ]]
      >>> print(round(float(current_kl), 4))
      0.75

    References:
      Ziegler et al., `Fine-Tuning Language Models from Human Preferences
      <https://arxiv.org/abs/1909.08593>`_, 2019.

      verl 0.9.1, ``verl/trainer/ppo/ray_trainer.py``, ``apply_kl_penalty``.
    """
    require_float("token_scores", token_scores)
    require_rank("token_scores", token_scores, 2, "[B, T]")
    require_same_shape("kl", kl, "token_scores", token_scores)
    require_same_shape("mask", mask, "token_scores", token_scores)
    if is_python_number(beta) and not math.isfinite(float(beta)):  # type: ignore[arg-type]
        raise ValueError(f"beta: expected a finite number, got {beta}")
    dtype = token_scores.dtype
    charged = select(jnp.asarray(kl, dtype), keep_of(mask))
    rewards = token_scores - jnp.asarray(beta, dtype) * charged
    current_kl = jnp.mean(mean_with_eps(charged, mask, axis=-1))
    return rewards, current_kl.astype(dtype)


def adaptive_kl_coefficient(
    coefficient: float, current_kl: float, n_steps: int, target: float, horizon: float
) -> float:
    """The next KL coefficient of the adaptive controller (Ziegler et al. 2019).

    Port of verl 0.9.1 ``AdaptiveKLController.update``: the proportional error
    ``clip(current_kl / target - 1, -0.2, 0.2)`` moves the coefficient by the factor
    ``1 + error * n_steps / horizon``. A KL above the target raises the coefficient, below
    it lowers it; with ``n_steps == horizon`` one update moves it by at most 20 %. verl calls
    it once per batch with ``n_steps`` the batch's row count.

    Host arithmetic in float64 (the controller's state is a Python float, as in verl), so a
    run resumed from a saved coefficient continues bit for bit.

    Args:
      coefficient: the current coefficient, >= 0.
      current_kl: the batch's mean KL (:func:`kl_reward`'s second result), finite.
      n_steps: how many samples the batch held, >= 0.
      target: the KL the controller steers to, > 0.
      horizon: samples over which a full correction is spread, > 0.

    Returns:
      The new coefficient, a Python float.

    Raises:
      ValueError: a non-finite or out-of-range argument, naming it.

    Examples:
      >>> import dew.rl as rl
      >>> print(round(rl.adaptive_kl_coefficient(0.1, 0.2, 64, target=0.1, horizon=640), 6))
      0.102
      >>> print(round(rl.adaptive_kl_coefficient(0.1, 0.05, 64, target=0.1, horizon=640), 6))
      0.098

    References:
      Ziegler et al., `Fine-Tuning Language Models from Human Preferences
      <https://arxiv.org/abs/1909.08593>`_, 2019, section 2.2.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``AdaptiveKLController``.
    """
    for name, value in (("coefficient", coefficient), ("current_kl", current_kl)):
        if not is_python_number(value) or not math.isfinite(float(value)):
            raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if float(coefficient) < 0:
        raise ValueError(f"coefficient: expected a number >= 0, got {coefficient}")
    for name, value in (("target", target), ("horizon", horizon)):
        if not is_python_number(value) or not float(value) > 0 or not math.isfinite(value):
            raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    if not is_python_number(n_steps) or int(n_steps) != n_steps or n_steps < 0:
        raise ValueError(f"n_steps: expected an integer >= 0, got {n_steps!r}")
    bound = ADAPTIVE_KL_ERROR_BOUND
    error = float(np.clip(float(current_kl) / float(target) - 1, -bound, bound))
    return float(coefficient) * (1 + error * int(n_steps) / float(horizon))


def overlong_penalty(
    lengths: jax.Array, max_length: int, buffer: int, penalty_factor: float
) -> jax.Array:
    """DAPO's soft overlong punishment: a reward ramp over the last ``buffer`` tokens.

    Port of the overlong term of verl 0.9.1's ``DAPORewardManager``: a response of
    ``length`` tokens (its EOS included, verl's ``valid_response_length``) gets
    ``min(-(length - (max_length - buffer)) / buffer * penalty_factor, 0)``: nothing up to
    ``max_length - buffer``, then a linear ramp to ``-penalty_factor`` at the budget. Add it
    to the outcome reward.

    Args:
      lengths: ``[B]`` response lengths, one per completion (integers or floats).
      max_length: the response budget, the sampler's ``max_new_tokens``.
      buffer: tokens before the budget over which the ramp runs, ``1..max_length``.
      penalty_factor: the penalty at the budget, >= 0.

    Returns:
      ``[B]`` float32 (or the lengths' float dtype), each <= 0 (+0 where not penalised).

    Raises:
      ValueError: ``buffer`` outside ``1..max_length`` or a negative ``penalty_factor``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> lengths = jnp.array([10, 13, 14, 16])
      >>> print(rl.overlong_penalty(lengths, 16, buffer=4, penalty_factor=1.0))
      [ 0.   -0.25 -0.5  -1.  ]

    References:
      Yu et al., `DAPO: An Open-Source LLM Reinforcement Learning System at Scale
      <https://arxiv.org/abs/2503.14476>`_, 2025, section 3.4.

      verl 0.9.1, ``verl/workers/reward_manager/dapo.py``, ``DAPORewardManager.__call__``.
    """
    if not is_python_number(max_length) or int(max_length) != max_length or max_length < 1:
        raise ValueError(f"max_length: expected a positive integer, got {max_length!r}")
    if not is_python_number(buffer) or int(buffer) != buffer or not 1 <= buffer <= max_length:
        raise ValueError(f"buffer: expected an integer in 1..{max_length}, got {buffer!r}")
    if not is_python_number(penalty_factor) or not 0 <= float(penalty_factor) < math.inf:
        raise ValueError(f"penalty_factor: expected a finite number >= 0, got {penalty_factor!r}")
    lengths = jnp.asarray(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths: expected shape [B], got shape {lengths.shape}")
    dtype = lengths.dtype if jnp.issubdtype(lengths.dtype, jnp.floating) else jnp.float32
    exceed = lengths.astype(dtype) - jnp.asarray(max_length - buffer, dtype)
    ramp = -exceed / jnp.asarray(buffer, dtype) * jnp.asarray(penalty_factor, dtype)
    return jnp.where(ramp < 0, ramp, jnp.zeros((), dtype))  # a +0 where there is no penalty

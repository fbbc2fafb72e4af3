"""PPO's clipped policy surrogate: the dual-clipped per-token loss, its mean, its backward.

``clipped_surrogate_terms`` gives ``[B, T]`` terms and verl's clip metrics; with Python-number
bounds its backward pass is written out (``jax.custom_vjp``) so the exponential of the log
ratio is recomputed rather than stored. ``clipped_surrogate`` is the token mean of those
terms. CISPO's surrogate lives in ``_cispo`` and the critic's loss in ``_value_loss``. The
elementwise pieces (branches, clip, dual clip, the tie shares of the backward pass) come
from the foundation ``_token_terms``, which the fused ``_policy_loss`` calls too.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    is_python_number,
    require_float,
    require_same_dtype,
    require_same_shape,
)
from dew.rl._masking import clamp, exact_mean, keep_of, mean_with_eps, select
from dew.rl._token_terms import SurrogateParts, SurrogateShares, surrogate_log_ratio_grad


def clipped_surrogate(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The dual-clipped PPO policy loss, averaged over the kept tokens.

    Port of verl 0.9.1 ``compute_policy_loss_vanilla`` with ``loss_agg_mode="token-mean"``
    on one data-parallel rank: :func:`clipped_surrogate_terms` reduced by
    :func:`token_mean`. With ``dual_clip=None`` and :func:`sequence_log_ratio` as
    ``log_ratio`` it is verl's ``compute_policy_loss_gspo`` (token-mean)::

        lr = sequence_log_ratio(log_probs, old_log_probs, mask)
        loss, metrics = clipped_surrogate(lr, advantages, mask, 3e-4, 4e-4, dual_clip=None)

    For another reduction, take the terms and use :func:`sequence_mean`,
    :func:`sequence_sum_mean` or :func:`sequence_sum_norm`.

    Args:
      log_ratio: ``[B, T]`` log ratios (:func:`token_log_ratio` or
        :func:`sequence_log_ratio`).
      advantages: ``[B, T]`` advantages, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      epsilon_low: lower clip range (ratio floor ``1 - epsilon_low``).
      epsilon_high: upper clip range (ratio ceiling ``1 + epsilon_high``).
      dual_clip: verl's ``clip_ratio_c`` (> 1), or None for no dual clip.

    Returns:
      ``(loss, metrics)``: the scalar loss in the inputs' dtype (nan when the mask keeps
      nothing) and the metrics of :func:`clipped_surrogate_terms` (``pg_clipfrac``,
      ``pg_clipfrac_lower``, ``ppo_kl``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_ratio = jnp.log(jnp.array([[1.0, 1.5, 0.5, 1.0]]))
      >>> advantages = jnp.array([[1.0, 1.0, -1.0, 2.0]])
      >>> mask = jnp.array([[1, 1, 1, 0]])
      >>> loss, metrics = rl.clipped_surrogate(log_ratio, advantages, mask)
      >>> print(f"{loss:.4f}")  # (-1 - 1.2 + 0.8) / 3; the last token is not kept
      -0.4667
      >>> print(f"{metrics['pg_clipfrac']:.4f}")  # the clip binds on 2 of 3 kept tokens
      0.6667

    References:
      Schulman et al., `Proximal Policy Optimization Algorithms
      <https://arxiv.org/abs/1707.06347>`_, 2017.

      Ye et al., `Mastering Complex Control in MOBA Games with Deep Reinforcement Learning
      <https://arxiv.org/abs/1912.09729>`_, 2020 (the dual clip).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla`` and
      ``agg_loss``.
    """
    terms, metrics = clipped_surrogate_terms(
        log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
    )
    return exact_mean(terms, keep_of(mask)), metrics


def clipped_surrogate_terms(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped policy loss per token, before any reduction, and verl's metrics.

    Port of verl 0.9.1 ``compute_policy_loss_vanilla`` up to its ``agg_loss`` call. With
    ``r = exp(log_ratio)`` and ``A`` the advantages, each kept token's loss is
    ``max(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))``; with ``dual_clip = c``
    the tokens with ``A < 0`` are further capped at ``-A c`` (arXiv:1912.09729).
    ``dual_clip=None`` drops that cap, which is GSPO's (and verl
    ``compute_policy_loss_gspo``'s) form.

    ``log_ratio`` is exponentiated as given: pass :func:`token_log_ratio` (clamped to
    +-20) for PPO/GRPO or :func:`sequence_log_ratio` (clamped at 10) for GSPO. Ties between
    the branches share the gradient evenly, as ``torch.maximum`` does.

    Positions outside the mask are replaced before any arithmetic (the double-``where``),
    so a nan there reaches neither the terms, the metrics nor any gradient; their terms
    are 0.

    With Python-number bounds the backward pass is written out (``jax.custom_vjp``): it
    keeps only the inputs and recomputes ``exp(log_ratio)``, which under ``jax.jit`` on CPU
    saves storing the exponential between the passes; it returns autodiff's gradients.
    Forward-mode differentiation (``jax.jvp``) then does not apply; traced bounds use
    plain autodiff.

    Args:
      log_ratio: ``[B, T]`` log importance ratios.
      advantages: ``[B, T]`` advantages (rollout data), same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      epsilon_low: lower clip range, the ratio is clipped at ``1 - epsilon_low``.
      epsilon_high: upper clip range, the ratio is clipped at ``1 + epsilon_high``.
      dual_clip: verl's ``clip_ratio_c``; must be above 1. None disables the dual clip.

    Returns:
      ``(terms, metrics)``: ``terms`` is ``[B, T]`` in the inputs' dtype; ``metrics`` holds
      scalars without gradient: ``pg_clipfrac`` (share of kept tokens where the clipped
      branch is larger), ``pg_clipfrac_lower`` (share where the dual clip binds, 0 when
      disabled) in float32 as verl's ``.float()`` makes them, and ``ppo_kl``
      (``mean_with_eps(-log_ratio, mask)``).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_ratio = jnp.log(jnp.array([[1.0, 1.5, 0.5, 5.0]]))
      >>> advantages = jnp.array([[1.0, 1.0, -1.0, -1.0]])
      >>> mask = jnp.ones((1, 4), bool)
      >>> terms, metrics = rl.clipped_surrogate_terms(log_ratio, advantages, mask)
      >>> print(terms)  # the last token's -A * r = 5 is capped at -A * 3 by the dual clip
      [[-1.  -1.2  0.8  3. ]]
      >>> print(metrics["pg_clipfrac_lower"])
      0.25

    References:
      Schulman et al., `Proximal Policy Optimization Algorithms
      <https://arxiv.org/abs/1707.06347>`_, 2017.

      Ye et al., `Mastering Complex Control in MOBA Games with Deep Reinforcement Learning
      <https://arxiv.org/abs/1912.09729>`_, 2020 (the dual clip).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``.
    """
    require_float("log_ratio", log_ratio)
    require_same_shape("advantages", advantages, "log_ratio", log_ratio)
    require_same_dtype("advantages", advantages, "log_ratio", log_ratio)
    require_same_shape("mask", mask, "log_ratio", log_ratio)
    if dual_clip is not None and is_python_number(dual_clip) and dual_clip <= 1.0:
        raise ValueError(f"dual_clip: expected a value above 1.0 or None, got {dual_clip}")
    keep = keep_of(mask)
    log_ratio = select(log_ratio, keep)
    advantages = select(advantages, keep)
    parts = SurrogateParts(log_ratio, advantages, epsilon_low, epsilon_high, dual_clip)

    clipfrac = mean_with_eps((parts.clipped > parts.unclipped).astype(jnp.float32), mask)
    if dual_clip is None:
        clipfrac_lower = jnp.zeros((), jnp.float32)
    else:
        binds = (parts.larger > parts.capped) & parts.negative
        clipfrac_lower = mean_with_eps(binds.astype(jnp.float32), mask)
    metrics = {
        "pg_clipfrac": clipfrac,
        "pg_clipfrac_lower": clipfrac_lower,
        "ppo_kl": mean_with_eps(-log_ratio, mask),
    }
    metrics = jax.lax.stop_gradient(metrics)

    bounds = (epsilon_low, epsilon_high, dual_clip)
    if all(b is None or is_python_number(b) for b in bounds):
        terms = _terms(log_ratio, advantages, keep, *bounds)
    else:  # traced bounds may carry gradients of their own: plain autodiff
        terms = select(parts.terms, keep)
    return terms, metrics


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _terms(
    log_ratio: jax.Array,
    advantages: jax.Array,
    keep: jax.Array,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None,
) -> jax.Array:
    parts = SurrogateParts(log_ratio, advantages, epsilon_low, epsilon_high, dual_clip)
    return select(parts.terms, keep)


def _terms_forward(
    log_ratio: jax.Array,
    advantages: jax.Array,
    keep: jax.Array,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    terms = _terms(log_ratio, advantages, keep, epsilon_low, epsilon_high, dual_clip)
    return terms, (log_ratio, advantages, keep)


def _terms_backward(
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None,
    residuals: tuple[jax.Array, jax.Array, jax.Array],
    cotangent: jax.Array,
) -> tuple[jax.Array, jax.Array, None]:
    """Reverse-mode autodiff's gradients of the terms, recomputed from the inputs.

    Only the (already masked) inputs are saved, so XLA computes ``exp(log_ratio)`` in the
    backward loop again instead of storing it in the forward one; the barrier keeps it
    from merging the two computations back into one stored array. The products follow
    autodiff's order, and the branch shares are autodiff's (``max``/``min`` split a tie
    evenly, the clamp passes gradient at and inside its bounds), so the log-ratio gradient
    is autodiff's to the bit, nan and inf at kept positions included. The advantages'
    gradient (two products summed at a tie) may differ in the last place under jit, where
    XLA may contract a multiply-add into one rounding.
    """
    log_ratio, advantages, keep = jax.lax.optimization_barrier(residuals)
    p = SurrogateParts(log_ratio, advantages, epsilon_low, epsilon_high, dual_clip)
    shares = SurrogateShares(p)
    grad_log_ratio = surrogate_log_ratio_grad(p, shares, cotangent)
    clamped = clamp(p.ratio, p.low, p.high)
    # Each use of -advantages transposes through its own negation, as in autodiff.
    grad_advantages = -((cotangent * shares.to_clipped) * clamped) + -(
        (cotangent * shares.to_unclipped) * p.ratio
    )
    if dual_clip is not None:
        capped_grad = (cotangent * shares.to_capped) * jnp.asarray(dual_clip, cotangent.dtype)
        grad_advantages = grad_advantages + -capped_grad
    return select(grad_log_ratio, keep), select(grad_advantages, keep), None


_terms.defvjp(_terms_forward, _terms_backward)

"""GRPO/PPO's policy loss in one call: dual-clipped surrogate plus k3 KL, token mean, fused.

``policy_loss`` computes what the composition ``clipped_surrogate(token_log_ratio(...))`` plus
``kl_coef * token_mean(k3_kl(...))`` computes, with a written-out derivative with respect to
the policy log-probabilities that is produced in the same elementwise pass as the loss
terms. Under ``jax.value_and_grad`` and ``jax.jit`` on CPU the step then reads each input
once for the terms and the gradient together instead of writing per-term arrays, reducing
them and reading the inputs again for the backward pass.

The per-token math is not restated here: the surrogate's branches, clips and tie shares
and k3's clamps and estimate come from the foundation ``_token_terms``, the same functions
``_clipped_surrogate`` and ``_kl`` call in their written-out backward passes; this module
only chains them and reduces. The tests pin this function to that composition, gradient
ties included, and to verl's recorded numbers.
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
from dew.rl._masking import (
    LOG_RATIO_BOUND,
    clamp,
    count_kept,
    divide,
    keep_of,
    mean_with_eps,
    select,
)
from dew.rl._token_terms import (
    SurrogateParts,
    SurrogateShares,
    k3_grad_d,
    k3_value,
    surrogate_log_ratio_grad,
)


def policy_loss(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    ref_log_probs: jax.Array | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
    kl_coef: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The token-mean GRPO/PPO policy loss with an optional k3 KL penalty, fused.

    Port of verl 0.9.1's actor loss with ``loss_agg_mode="token-mean"`` on one data-parallel
    rank: ``compute_policy_loss_vanilla`` plus, when ``ref_log_probs`` is given,
    ``kl_coef * agg_loss(kl_penalty(log_prob, ref_log_prob, "k3"))`` (``use_kl_loss``). It
    equals, value and gradient, the composition::

        pg, _ = clipped_surrogate(token_log_ratio(log_probs, old_log_probs), advantages,
                                  mask, epsilon_low, epsilon_high, dual_clip)
        loss = pg + kl_coef * token_mean(k3_kl(log_probs, ref_log_probs), mask)

    with the same clamps (log ratio to +-20, k3's ``d`` to +-20 and estimate to +-10, each
    passing gradient at and inside its bounds) and the same tie rule (``max``/``min`` split a
    tie's gradient evenly). The gradient's products are in autodiff's order; the loss sums
    ``pg + kl_coef * kl`` per token and divides once where the composition divides two
    sums, so the two differ by float rounding (an ulp or two of the loss).

    Only ``log_probs`` is differentiated: ``old_log_probs``, ``advantages`` and
    ``ref_log_probs`` are rollout data, detached as in verl, and pass under
    ``jax.lax.stop_gradient`` (their gradients are zero). The derivative is written out
    (``jax.custom_vjp``; no ``jax.jvp``) and computed in the forward pass, in the same loop
    as the loss terms; the backward pass only scales it by the cotangent. Positions outside
    the mask are replaced before any arithmetic, so a nan there reaches neither the loss,
    the metrics nor the gradient (which is 0 there). For another reduction, the GSPO ratio,
    CISPO, or traced clip bounds, compose the ``*_terms`` functions instead.

    Args:
      log_probs: ``[B, T]`` floating log-probabilities of the taken tokens, current policy.
      old_log_probs: ``[B, T]`` the same under the sampling policy, same dtype.
      advantages: ``[B, T]`` advantages, same dtype.
      mask: ``[B, T]``; non-zero keeps a position.
      ref_log_probs: ``[B, T]`` reference log-probabilities, same dtype, or None for no KL
        term (then ``kl_coef`` must be 0).
      epsilon_low: lower clip range (ratio floor ``1 - epsilon_low``), a Python number.
      epsilon_high: upper clip range (ratio ceiling ``1 + epsilon_high``), a Python number.
      dual_clip: verl's ``clip_ratio_c`` (> 1), or None for no dual clip.
      kl_coef: the k3 KL's coefficient (verl ``kl_loss_coef``), a Python number.

    Returns:
      ``(loss, metrics)``: the scalar loss in the inputs' dtype (nan when the mask keeps
      nothing; the gradient is then 0) and, without gradient, ``pg_loss`` and ``kl_loss``
      (the two token means; ``kl_loss`` only with ``ref_log_probs``), ``pg_clipfrac``,
      ``pg_clipfrac_lower`` and ``ppo_kl`` as :func:`clipped_surrogate` reports them.
      Under ``jax.jit`` a metric the caller drops costs nothing.

    Raises:
      ValueError: a bound is not a Python number, ``dual_clip <= 1``, or ``kl_coef != 0``
        without ``ref_log_probs``.

    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.log(jnp.array([[1.0, 1.5, 0.5, 1.0]]))
      >>> old = jnp.zeros((1, 4))
      >>> advantages = jnp.array([[1.0, 1.0, -1.0, 2.0]])
      >>> mask = jnp.array([[1, 1, 1, 0]])
      >>> loss, metrics = rl.policy_loss(log_probs, old, advantages, mask)
      >>> print(f"{loss:.4f}")  # as rl.clipped_surrogate: (-1 - 1.2 + 0.8) / 3
      -0.4667
      >>> grad = jax.grad(lambda lp: rl.policy_loss(lp, old, advantages, mask)[0])(log_probs)
      >>> print(grad.round(4) + 0.0)  # clipped tokens and padding get 0 (+ 0.0 drops a -0)
      [[-0.3333  0.      0.      0.    ]]

    References:
      Schulman et al., `Proximal Policy Optimization Algorithms
      <https://arxiv.org/abs/1707.06347>`_, 2017; Shao et al., `DeepSeekMath
      <https://arxiv.org/abs/2402.03300>`_, 2024 (GRPO's KL term); Schulman,
      `Approximating KL Divergence <http://joschu.net/blog/kl-approx.html>`_, 2020.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``,
      ``kl_penalty`` and ``agg_loss``; ``verl/workers/actor/dp_actor.py``
      (``use_kl_loss``).
    """
    require_float("log_probs", log_probs)
    for name, other in (("old_log_probs", old_log_probs), ("advantages", advantages)):
        require_same_shape(name, other, "log_probs", log_probs)
        require_same_dtype(name, other, "log_probs", log_probs)
    require_same_shape("mask", mask, "log_probs", log_probs)
    if ref_log_probs is None:
        if kl_coef != 0:
            raise ValueError(f"kl_coef: expected 0 without ref_log_probs, got {kl_coef}")
    else:
        require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
        require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    for name, value in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high),
                        ("kl_coef", kl_coef), ("dual_clip", dual_clip)):  # fmt: skip
        if value is not None and not is_python_number(value):
            raise ValueError(f"{name}: expected a Python number, got {type(value).__name__}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip: expected a value above 1.0 or None, got {dual_clip}")
    keep = keep_of(mask)
    old, adv = (jax.lax.stop_gradient(select(x, keep)) for x in (old_log_probs, advantages))
    ref = None if ref_log_probs is None else jax.lax.stop_gradient(select(ref_log_probs, keep))
    lp = select(log_probs, keep)
    options = (float(epsilon_low), float(epsilon_high),
               None if dual_clip is None else float(dual_clip), float(kl_coef))  # fmt: skip
    loss = _loss(lp, old, adv, ref, keep, options)
    metrics = _metrics(jax.lax.stop_gradient(lp), old, adv, ref, keep, mask, options)
    return loss, jax.lax.stop_gradient(metrics)


Options = tuple[float, float, float | None, float]


class _Pieces:
    """Per-token terms of the loss for masked-in inputs, from the ``_token_terms`` pieces:
    the token log ratio (clamped to +-20, with where that clamp passes gradient), the
    surrogate's parts and, with ``ref``, k3's clamped estimate, ``exp(d)`` and its pass mask.
    """

    def __init__(
        self, lp: jax.Array, old: jax.Array, adv: jax.Array, ref: jax.Array | None, options: Options
    ) -> None:
        low_eps, high_eps, dual_clip, _ = options
        diff = lp - old
        self.log_ratio = clamp(diff, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        self.ratio_passes = ~(diff < -LOG_RATIO_BOUND) & ~(diff > LOG_RATIO_BOUND)
        self.surrogate = SurrogateParts(self.log_ratio, adv, low_eps, high_eps, dual_clip)
        self.kl: jax.Array | None = None
        if ref is not None:
            self.kl, self.e, self.kl_passes = k3_value(lp, ref)


def _value(p: _Pieces, keep: jax.Array, count: jax.Array, options: Options) -> jax.Array:
    """``sum(pg + kl_coef * kl) / count`` over the kept tokens: one sum, one reduction pass.

    The composition (and verl) divides two sums, ``pg_mean + kl_coef * kl_mean``; the
    two differ by float rounding only.
    """
    pg = p.surrogate.terms
    terms = pg if p.kl is None else pg + options[3] * p.kl
    return divide(jnp.sum(select(terms, keep)), count, terms.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _loss(lp, old, adv, ref, keep, options):  # type: ignore[no-untyped-def]
    return _value(_Pieces(lp, old, adv, ref, options), keep, count_kept(keep), options)


def _loss_forward(lp, old, adv, ref, keep, options):  # type: ignore[no-untyped-def]
    """Loss and the per-token gradient for a unit cotangent, from one pass over the inputs."""
    p = _Pieces(lp, old, adv, ref, options)
    count = count_kept(keep)
    dtype = lp.dtype
    zero = jnp.zeros((), dtype)
    # The token mean's cotangent, as ``divide`` transposes: 1 / count (kl_coef / count).
    share = divide(jnp.ones((), dtype), count, dtype)
    grad = surrogate_log_ratio_grad(p.surrogate, SurrogateShares(p.surrogate), share)
    grad = jnp.where(p.ratio_passes, grad, zero)  # the +-20 clamp
    if p.kl is not None:
        kl_share = divide(jnp.asarray(options[3], dtype), count, dtype)
        grad = grad + -k3_grad_d(p.e, p.kl_passes, kl_share)
    return _value(p, keep, count, options), select(grad, keep)


def _loss_backward(options, grad, cotangent):  # type: ignore[no-untyped-def]
    return cotangent * grad, None, None, None, None


_loss.defvjp(_loss_forward, _loss_backward)


def _metrics(
    lp: jax.Array,
    old: jax.Array,
    adv: jax.Array,
    ref: jax.Array | None,
    keep: jax.Array,
    mask: jax.Array,
    options: Options,
) -> dict[str, jax.Array]:
    """verl's pg metrics and the two token means (``_clipped_surrogate``'s definitions)."""
    p = _Pieces(lp, old, adv, ref, options)
    s = p.surrogate
    count = count_kept(keep)
    dtype = lp.dtype
    out = {
        "pg_loss": divide(jnp.sum(select(s.terms, keep)), count, dtype),
        "pg_clipfrac": mean_with_eps((s.clipped > s.unclipped).astype(jnp.float32), mask),
        "pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "ppo_kl": mean_with_eps(-p.log_ratio, mask),
    }
    if s.dual:
        binds = (s.larger > s.capped) & s.negative
        out["pg_clipfrac_lower"] = mean_with_eps(binds.astype(jnp.float32), mask)
    if p.kl is not None:
        out["kl_loss"] = divide(jnp.sum(select(p.kl, keep)), count, dtype)
    return out

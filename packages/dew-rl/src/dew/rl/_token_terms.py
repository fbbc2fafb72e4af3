"""Per-token values and derivatives of the clipped surrogate and k3, shared (private).

The third foundation of ``dew.rl``, beside ``_checks`` and ``_masking`` (whose ``clamp`` it
uses). Two themes need the same elementwise math: ``_clipped_surrogate`` and ``_kl`` each
write their backward pass out (``jax.custom_vjp``), and ``_policy_loss`` fuses both of
them, forward and derivative, into one pass. The rule that a theme imports no other theme
would make ``_policy_loss`` restate the math operation for operation; instead the three
call the functions here, so the fused loss and the composition evaluate the same
expressions and agree to the bit where their reductions do.

Everything here is elementwise on masked-in ``[B, T]`` arrays (the callers select the
mask away first) and reproduces reverse-mode autodiff of the forward expressions: the
clamps pass gradient at and inside their bounds, none strictly beyond (``torch.clamp``'s
rule; a nan passes), and ``max``/``min`` split a tie's cotangent evenly, as ``jax.lax``
and ``torch.maximum`` do. The products keep autodiff's order so the results are its
results to the bit.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._masking import clamp

#: verl's k3 bounds: on ``d = log pi_ref - log pi`` before the exponential.
K3_LOG_RATIO_BOUND = 20.0
#: ... and on the estimate after it.
K3_ESTIMATE_BOUND = 10.0


class SurrogateParts:
    """The dual-clipped surrogate's intermediate arrays for masked-in inputs.

    ``terms`` is ``max(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))`` with
    ``r = exp(log_ratio)``, capped at ``-A * dual_clip`` where ``A < 0`` when ``dual_clip``
    is given (verl 0.9.1 ``compute_policy_loss_vanilla``).
    """

    def __init__(
        self,
        log_ratio: jax.Array,
        advantages: jax.Array,
        epsilon_low: float,
        epsilon_high: float,
        dual_clip: float | None,
    ) -> None:
        self.ratio = jnp.exp(log_ratio)
        self.low, self.high = 1 - epsilon_low, 1 + epsilon_high
        self.neg_advantages = -advantages
        self.unclipped = self.neg_advantages * self.ratio
        self.clipped = self.neg_advantages * clamp(self.ratio, self.low, self.high)
        self.larger = jnp.maximum(self.unclipped, self.clipped)
        self.terms = self.larger
        self.dual = dual_clip is not None
        if dual_clip is not None:
            self.capped = -advantages * jnp.asarray(dual_clip, log_ratio.dtype)
            self.negative = advantages < 0
            self.smaller = jnp.minimum(self.capped, self.larger)
            self.terms = jnp.where(self.negative, self.smaller, self.larger)


def tie_share(x: jax.Array, result: jax.Array, other: jax.Array) -> jax.Array:
    """The share of ``max``/``min``'s cotangent that reaches ``x``, as jax.lax defines it:
    1 when ``x`` is the result alone, 1/2 at a tie with ``other``, 0 otherwise."""
    half_or_one = jnp.where(other == result, 0.5, 1.0).astype(x.dtype)
    return jnp.where(x == result, half_or_one, jnp.zeros((), x.dtype))


class SurrogateShares:
    """How a unit cotangent of :class:`SurrogateParts` ``terms`` splits among its branches.

    ``to_unclipped``, ``to_clipped`` and ``to_capped`` are the shares reaching ``-A r``,
    ``-A clip(r)`` and the dual cap (0 without it); ``weight`` is what reaches
    ``-A r`` through the ratio, the clipped branch counting only inside its band (the
    clamp's gradient).
    """

    def __init__(self, p: SurrogateParts) -> None:
        zero = jnp.zeros((), p.ratio.dtype)
        in_band = ~(p.ratio < p.low) & ~(p.ratio > p.high)
        self.to_unclipped = tie_share(p.unclipped, p.larger, p.clipped)
        self.to_clipped = tie_share(p.clipped, p.larger, p.unclipped)
        self.to_capped = zero
        if p.dual:
            # The dual clip's min on negative advantages: what reaches max and the cap.
            to_larger = jnp.where(p.negative, tie_share(p.larger, p.smaller, p.capped), 1.0)
            self.to_capped = jnp.where(p.negative, tie_share(p.capped, p.smaller, p.larger), zero)
            self.to_unclipped *= to_larger
            self.to_clipped *= to_larger
        self.weight = self.to_unclipped + jnp.where(in_band, self.to_clipped, zero)


def surrogate_log_ratio_grad(
    p: SurrogateParts, s: SurrogateShares, cotangent: jax.Array
) -> jax.Array:
    """The terms' gradient in ``log_ratio`` for ``cotangent`` (an array or a scalar)."""
    return ((cotangent * s.weight) * p.neg_advantages) * p.ratio


def k3_value(
    log_probs: jax.Array, ref_log_probs: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """k3's clamped estimate ``exp(d) - d - 1``, ``exp(d)``, and where both clamps pass
    gradient, for ``d = ref_log_probs - log_probs`` (verl 0.9.1 ``kl_penalty_forward``).

    ``jnp.clip`` gives the values of :func:`clamp` (nan included) but is a different
    expression: with ``d`` feeding only the subtraction and the clip only the exponential,
    XLA fuses the whole chain into its consumer instead of storing ``d`` for two users.
    """
    diff = ref_log_probs - log_probs
    d = clamp(diff, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    e = jnp.exp(jnp.clip(diff, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND))
    estimate = e - d - 1
    # Each clamp passes gradient unless its input lies strictly beyond a bound (nan passes).
    passes = ~(diff < -K3_LOG_RATIO_BOUND) & ~(diff > K3_LOG_RATIO_BOUND)
    passes &= ~(estimate < -K3_ESTIMATE_BOUND) & ~(estimate > K3_ESTIMATE_BOUND)
    return clamp(estimate, -K3_ESTIMATE_BOUND, K3_ESTIMATE_BOUND), e, passes


def k3_grad_d(e: jax.Array, passes: jax.Array, cotangent: jax.Array) -> jax.Array:
    """k3's gradient in ``d`` for ``cotangent`` (an array or a scalar), accumulated as
    reverse mode does, ``ct * exp(d) - ct``, and 0 where a clamp blocks it. The gradient
    in ``log_probs`` is its negation, in ``ref_log_probs`` itself."""
    return jnp.where(passes, cotangent * e - cotangent, jnp.zeros((), cotangent.dtype))

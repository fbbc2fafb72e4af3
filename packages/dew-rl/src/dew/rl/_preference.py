"""Preference losses on pairs of completions: DPO's sigmoid loss."""

# Ports TRL 1.16.0 (Apache License 2.0, Copyright 2020-2025 The HuggingFace Team).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank, require_same_dtype, require_same_shape
from dew.rl._masking import keep_of, select


def preference_logsigmoid(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float,
) -> jax.Array:
    """The DPO loss ``-log sigmoid(beta * margin)`` averaged over pairs (arXiv:2305.18290).

    Port of TRL 1.16.0 ``DPOTrainer._compute_loss`` with ``loss_type="sigmoid"`` and no
    label smoothing. Each side's sequence log-probability is the sum of its per-token
    log-probabilities over its mask (positions outside a mask are selected away, so a nan
    there reaches neither loss nor gradient); the margin is
    ``(policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)`` on those sums. The
    reference log-probabilities carry no gradient.

    Args:
      policy_chosen: ``[B, T]`` policy log-probabilities of the chosen completion's tokens.
      policy_rejected: ``[B, T]`` the same for the rejected completion.
      ref_chosen: ``[B, T]`` reference log-probabilities of the chosen tokens.
      ref_rejected: ``[B, T]`` reference log-probabilities of the rejected tokens.
      mask_chosen: ``[B, T]``; non-zero marks the chosen completion's tokens.
      mask_rejected: ``[B, T]``; non-zero marks the rejected completion's tokens.
      beta: the DPO temperature.

    Returns:
      The scalar mean loss over the ``B`` pairs, in the inputs' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> policy_chosen = jnp.array([[-1.0, -1.0]])
      >>> policy_rejected = jnp.array([[-2.0, -2.0]])
      >>> ref = jnp.array([[-1.5, -1.5]])  # the same reference on both sides
      >>> mask = jnp.ones((1, 2), bool)
      >>> loss = rl.preference_logsigmoid(
      ...     policy_chosen, policy_rejected, ref, ref, mask, mask, beta=0.5
      ... )
      >>> print(f"{loss:.4f}")  # -log sigmoid(0.5 * ((-2 + 3) - (-4 + 3)))
      0.3133

    References:
      Rafailov et al., `Direct Preference Optimization: Your Language Model is Secretly a
      Reward Model <https://arxiv.org/abs/2305.18290>`_, 2023.

      TRL 1.16.0, ``trl/trainer/dpo_trainer.py``, ``DPOTrainer._compute_loss``
      (``loss_type="sigmoid"``).
    """
    require_float("policy_chosen", policy_chosen)
    require_rank("policy_chosen", policy_chosen, 2, "[B, T]")
    for name, value in (
        ("policy_rejected", policy_rejected),
        ("ref_chosen", ref_chosen),
        ("ref_rejected", ref_rejected),
    ):
        require_same_shape(name, value, "policy_chosen", policy_chosen)
        require_same_dtype(name, value, "policy_chosen", policy_chosen)
    require_same_shape("mask_chosen", mask_chosen, "policy_chosen", policy_chosen)
    require_same_shape("mask_rejected", mask_rejected, "policy_chosen", policy_chosen)
    keep_chosen = keep_of(mask_chosen)
    keep_rejected = keep_of(mask_rejected)
    chosen = jnp.sum(select(policy_chosen, keep_chosen), axis=-1)
    rejected = jnp.sum(select(policy_rejected, keep_rejected), axis=-1)
    ref_chosen_sum = jax.lax.stop_gradient(jnp.sum(select(ref_chosen, keep_chosen), axis=-1))
    ref_rejected_sum = jax.lax.stop_gradient(jnp.sum(select(ref_rejected, keep_rejected), axis=-1))
    margin = (chosen - ref_chosen_sum) - (rejected - ref_rejected_sum)
    return jnp.mean(-jax.nn.log_sigmoid(beta * margin))

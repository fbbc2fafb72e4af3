"""dew.rl: reinforcement-learning math for post-training, as pure JAX array functions.

Arrays in, arrays out: no models, objectives, trainers or config objects. Every function
jits (switches such as ``group``, ``mean`` or ``dual_clip=None`` are static Python
values), selects with masks through ``jnp.where`` so padding never reaches a result or a
gradient, and names the reference it ports (verl 0.9.1, TRL 1.16.0, Tunix) in its
docstring. Shapes: ``B`` rows, ``T`` tokens; a mask is boolean or numeric, non-zero
keeps a position; ``segments`` are integer chain ids of packed rows, 0 = padding.

Signatures of the functions beyond the core GRPO/PPO/DPO set::

    segment_mean(x, mask, segments) -> [B, T]
    group_sums(x, mask, group_ids) -> ([B * T], [B * T])         # per-id sums and counts
    sequence_mean(x, mask, segments=None) -> scalar              # seq-mean-token-mean
    sequence_sum_mean(x, mask, segments=None) -> scalar          # seq-mean-token-sum
    sequence_sum_norm(x, mask, norm=None, segments=None) -> scalar  # ...-token-sum-norm
    clipped_surrogate_terms(log_ratio, advantages, mask, epsilon_low=0.2,
                            epsilon_high=0.2, dual_clip=3.0) -> ([B, T], metrics)
    cispo_terms(log_probs, old_log_probs, advantages, mask, epsilon_low=0.2,
                epsilon_high=0.2) -> ([B, T], metrics)
    policy_loss(log_probs, old_log_probs, advantages, mask, ref_log_probs=None,
                epsilon_low=0.2, epsilon_high=0.2, dual_clip=3.0, kl_coef=0.0)
                -> (scalar, metrics)                             # token-mean GRPO/PPO loss
    k1_kl(log_probs, ref_log_probs) -> [B, T]
    abs_kl(log_probs, ref_log_probs) -> [B, T]
    k2_kl(log_probs, ref_log_probs) -> [B, T]
    kl_penalty(log_probs, ref_log_probs, estimator="low_var_kl") -> [B, T]  # by verl's name
    kl_reward(token_scores, kl, mask, beta) -> ([B, T], scalar)  # KL in the reward
    adaptive_kl_coefficient(coefficient, current_kl, n_steps, target, horizon) -> float
    overlong_penalty(lengths, max_length, buffer, penalty_factor) -> [B]  # DAPO
    token_entropy(logits) -> logits.shape[:-1]
    icepop_weights(old_log_probs, behavior_log_probs, mask, low, high) -> [B, T]
    token_rejection_mask(old_log_probs, behavior_log_probs, mask, low, high) -> [B, T]
    sequence_rejection_mask(old_log_probs, behavior_log_probs, mask, low, high,
                            mean=False, segments=None) -> [B, T]
    ragged_group_advantage(rewards, group_ids, mask=None, estimator="group",
                           eps=GROUP_EPS) -> [B]
    register_policy_loss(name), register_advantage_estimator(name),
    register_aggregation(name) -> decorator
    get_policy_loss(name), get_advantage_estimator(name), get_aggregation(name) -> function
    registered(kind) -> tuple of names   # kind: "policy_loss", "estimator", "aggregation"

GSPO is a composition, not a function::

    log_ratio = sequence_log_ratio(log_probs, old_log_probs, mask, segments)
    loss, metrics = clipped_surrogate(log_ratio, advantages, mask, 3e-4, 4e-4, dual_clip=None)

Layout, as in optax: the functions live in private modules by theme and are re-exported
here; import them from ``dew.rl``, never from the modules::

    _gae          gae, masked_whiten
    _group        group_advantage, rloo_advantage, ragged_group_advantage
    _ratios       token_log_ratio, sequence_log_ratio
    _clipped_surrogate  clipped_surrogate, clipped_surrogate_terms
    _cispo        cispo_terms
    _value_loss   clipped_value_loss_terms
    _kl           k1_kl, abs_kl, k2_kl, k3_kl, kl_penalty, KL_ESTIMATORS
    _policy_loss  policy_loss (the token-mean surrogate + k3 KL above, fused with its
                  gradient: GRPO/PPO's actor loss at one pass over [B, T], from the
                  same _token_terms pieces)
    _entropy      token_entropy
    _reward_shaping  kl_reward, adaptive_kl_coefficient, overlong_penalty (rewards shaped
                  before the advantage; takes a per-token KL, so it needs no _kl)
    _reductions   token_mean, masked_mean, sequence_mean, sequence_sum_mean,
                  sequence_sum_norm, segment_mean, group_sums
    _corrections  behavior_importance_weights, icepop_weights, token_rejection_mask,
                  sequence_rejection_mask
    _preference   preference_logsigmoid
    _registry     registered, register_policy_loss, get_policy_loss,
                  register_advantage_estimator, get_advantage_estimator,
                  register_aggregation, get_aggregation (entries picked by name; the
                  built-in ones, adapters of the functions above, live in _builtins)

A themed module imports only the foundations, ``_checks`` (argument checks), ``_masking``
(mask, dtype, count and chain arithmetic, and the few reductions two themes share) and
``_token_terms`` (the elementwise values and derivatives of the clipped surrogate and k3
that ``_clipped_surrogate``, ``_kl`` and the fused ``_policy_loss`` all evaluate, so the
fused loss composes them instead of restating them), never another theme. ``_registry`` and ``_builtins`` are no themes but composition
layers, like this module: they import from the themes, and no theme imports them. Every public function's docstring ends with a runnable
``Examples:`` block and a ``References:`` block naming the paper and the reference code
(file and function) it follows.
"""

from dew.rl._cispo import cispo_terms
from dew.rl._clipped_surrogate import clipped_surrogate, clipped_surrogate_terms
from dew.rl._corrections import (
    behavior_importance_weights,
    icepop_weights,
    sequence_rejection_mask,
    token_rejection_mask,
)
from dew.rl._entropy import token_entropy
from dew.rl._gae import gae, masked_whiten
from dew.rl._group import GROUP_EPS, group_advantage, ragged_group_advantage, rloo_advantage
from dew.rl._kl import KL_ESTIMATORS, abs_kl, k1_kl, k2_kl, k3_kl, kl_penalty
from dew.rl._policy_loss import policy_loss
from dew.rl._preference import preference_logsigmoid
from dew.rl._ratios import sequence_log_ratio, token_log_ratio
from dew.rl._reductions import (
    group_sums,
    masked_mean,
    segment_mean,
    sequence_mean,
    sequence_sum_mean,
    sequence_sum_norm,
    token_mean,
)
from dew.rl._registry import (
    get_advantage_estimator,
    get_aggregation,
    get_policy_loss,
    register_advantage_estimator,
    register_aggregation,
    register_policy_loss,
    registered,
)
from dew.rl._reward_shaping import adaptive_kl_coefficient, kl_reward, overlong_penalty
from dew.rl._value_loss import clipped_value_loss_terms

__all__ = [
    "GROUP_EPS",
    "KL_ESTIMATORS",
    "abs_kl",
    "adaptive_kl_coefficient",
    "behavior_importance_weights",
    "cispo_terms",
    "clipped_surrogate",
    "clipped_surrogate_terms",
    "clipped_value_loss_terms",
    "gae",
    "get_advantage_estimator",
    "get_aggregation",
    "get_policy_loss",
    "group_advantage",
    "group_sums",
    "icepop_weights",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "kl_penalty",
    "kl_reward",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "preference_logsigmoid",
    "ragged_group_advantage",
    "register_advantage_estimator",
    "register_aggregation",
    "register_policy_loss",
    "registered",
    "rloo_advantage",
    "segment_mean",
    "sequence_log_ratio",
    "sequence_mean",
    "sequence_rejection_mask",
    "sequence_sum_mean",
    "sequence_sum_norm",
    "token_entropy",
    "token_log_ratio",
    "token_mean",
    "token_rejection_mask",
]

"""dew.rl: reinforcement-learning math for post-training, as pure JAX array functions.

Arrays in, arrays out: no models, objectives, trainers or config objects. Every function
jits (switches such as ``group``, ``mean`` or ``dual_clip=None`` are static Python
values), selects with masks through ``jnp.where`` so padding never reaches a result or a
gradient, and names the reference it ports (verl 0.9.1, TRL 1.16.0, Tunix) in its
docstring. Shapes: ``B`` rows, ``T`` tokens; a mask is boolean or numeric, non-zero
keeps a position; ``segments`` are integer chain ids of packed rows, 0 = padding.

Signatures beyond the spec's table::

    segment_mean(x, mask, segments) -> [B, T]
    sequence_mean(x, mask, segments=None) -> scalar              # seq-mean-token-mean
    sequence_sum_mean(x, mask, segments=None) -> scalar          # seq-mean-token-sum
    sequence_sum_norm(x, mask, norm=None, segments=None) -> scalar  # ...-token-sum-norm
    clipped_surrogate_terms(log_ratio, advantages, mask, epsilon_low=0.2,
                            epsilon_high=0.2, dual_clip=3.0) -> ([B, T], metrics)
    cispo_terms(log_probs, old_log_probs, advantages, mask, epsilon_low=0.2,
                epsilon_high=0.2) -> ([B, T], metrics)
    k1_kl(log_probs, ref_log_probs) -> [B, T]
    k2_kl(log_probs, ref_log_probs) -> [B, T]
    token_entropy(logits) -> logits.shape[:-1]
    icepop_weights(old_log_probs, behavior_log_probs, mask, low, high) -> [B, T]
    token_rejection_mask(old_log_probs, behavior_log_probs, mask, low, high) -> [B, T]
    sequence_rejection_mask(old_log_probs, behavior_log_probs, mask, low, high,
                            mean=False, segments=None) -> [B, T]

GSPO is a composition, not a function::

    log_ratio = sequence_log_ratio(log_probs, old_log_probs, mask, segments)
    loss, metrics = clipped_surrogate(log_ratio, advantages, mask, 3e-4, 4e-4, dual_clip=None)
"""

from dew.rl._behavior_importance_weights import behavior_importance_weights
from dew.rl._cispo_terms import cispo_terms
from dew.rl._clipped_surrogate import clipped_surrogate
from dew.rl._clipped_surrogate_terms import clipped_surrogate_terms
from dew.rl._clipped_value_loss_terms import clipped_value_loss_terms
from dew.rl._gae import gae
from dew.rl._group_advantage import GROUP_EPS, group_advantage
from dew.rl._icepop_weights import icepop_weights
from dew.rl._k1_kl import k1_kl
from dew.rl._k2_kl import k2_kl
from dew.rl._k3_kl import k3_kl
from dew.rl._masked_mean import masked_mean
from dew.rl._masked_whiten import masked_whiten
from dew.rl._preference_logsigmoid import preference_logsigmoid
from dew.rl._rloo_advantage import rloo_advantage
from dew.rl._segment_mean import segment_mean
from dew.rl._sequence_log_ratio import sequence_log_ratio
from dew.rl._sequence_mean import sequence_mean
from dew.rl._sequence_rejection_mask import sequence_rejection_mask
from dew.rl._sequence_sum_mean import sequence_sum_mean
from dew.rl._sequence_sum_norm import sequence_sum_norm
from dew.rl._token_entropy import token_entropy
from dew.rl._token_log_ratio import token_log_ratio
from dew.rl._token_mean import token_mean
from dew.rl._token_rejection_mask import token_rejection_mask

__all__ = [
    "GROUP_EPS",
    "behavior_importance_weights",
    "cispo_terms",
    "clipped_surrogate",
    "clipped_surrogate_terms",
    "clipped_value_loss_terms",
    "gae",
    "group_advantage",
    "icepop_weights",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "masked_mean",
    "masked_whiten",
    "preference_logsigmoid",
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

"""DPOObjective: direct preference optimization against a frozen copy of the starting policy.

Batch (``S = seq_len + 1``, from ``dew.data.PreferencePairs``):

- ``input_ids`` int ``[B, 2, S]``: per pair, index 0 the chosen row and 1 the rejected row,
  each the shared prompt followed by its own completion, right-padded.
- ``completion_mask`` int ``[B, 2, S]``: 1 on completion tokens, 0 on prompt and padding.

Both sides of every pair go through the model as one ``[2B, S - 1]`` forward; the log-prob of
token ``t + 1`` given the tokens up to ``t`` counts when ``completion_mask[..., t + 1]`` is 1
(the mask shifts with the targets, so the first id is never scored). The same forward runs
on the reference variables (``TrainState.ema``, frozen because ``ema_decay`` is 1) under
``stop_gradient``. ``dew.rl.preference_logsigmoid`` turns the four per-token arrays into the
sigmoid DPO loss ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` averaged over
pairs, the formula of TRL 1.16.0's ``DPOTrainer._compute_loss`` with ``loss_type="sigmoid"``
(pinned by ``tests/parity/test_dpo_parity.py``).

With ``nll_weight`` (``alpha``) above zero the loss gains RPO's term (Pang et al. 2024,
"Iterative Reasoning Preference Optimization"): ``alpha`` times the mean token NLL of the
chosen completions of the (micro)batch, as TRL 1.16.0 computes it for
``loss_type=["sigmoid", "sft"]`` with ``loss_weights=[1, alpha]``. Pure DPO can widen the
margin by pushing both sides down; the NLL term keeps the chosen answer's likelihood rising,
which is what lifts greedy accuracy when the chosen side is the right answer.

``loss`` returns ``(sum over pairs, number of pairs, metrics)``; metrics are means over the
pairs of the batch: ``rewards/chosen`` and ``rewards/rejected`` (``beta`` times each side's
summed log-ratio of policy over reference), ``rewards/accuracy`` (share of pairs whose chosen
reward is strictly higher) and ``rewards/margin`` (chosen minus rejected reward), plus
``logps/chosen`` and ``logps/rejected`` (summed policy log-probs), and ``nll/chosen`` (the
token-mean NLL of the chosen completions, the term ``nll_weight`` scales). An unmoved policy
reports zero rewards and zero accuracy.

``evaluate`` measures the policy's perplexity on the chosen completions only (the summed token
NLL and token count, turned into loss, perplexity and accuracy by ``summarize_evaluation``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dew.checks import is_int, is_real
from dew.objectives.base import initial_variables, validate_pretrained
from dew.objectives.scoring import nll_sums, summarize_nll, target_log_probs, token_nll
from dew.rl import preference_logsigmoid

_FIELDS = ("input_ids", "completion_mask")


def sequence_log_prob(log_probs: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of ``log_probs`` over the positions ``mask`` keeps: ``[..., T] -> [...]``."""
    return jnp.sum(jnp.where(mask, log_probs, 0.0), axis=-1)


def chosen_nll(policy: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean NLL over the chosen completion tokens of a batch (RPO's term).

    Args:
      policy: float ``[B, 2, T]`` per-target log-probs (index 0 chosen).
      mask: bool ``[B, 2, T]``, the targets that are completion tokens.
    Returns:
      a scalar: minus the sum of the chosen side's kept log-probs over their count, pooled
      over all pairs (a token mean, not a mean of per-pair means). A batch with no chosen
      token gives 0 instead of TRL's NaN.
    """
    kept = mask[:, 0]
    total = jnp.sum(jnp.where(kept, policy[:, 0], 0.0))
    count = jnp.sum(kept).astype(policy.dtype)
    return -total / jnp.maximum(count, 1.0)


def dpo_terms(
    policy: jax.Array,
    reference: jax.Array,
    mask: jax.Array,
    beta: float,
    nll_weight: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DPO (or RPO) loss and metrics from per-token log-probs of both sides.

    Args:
      policy: float ``[B, 2, T]``, log-prob of each target under the policy (index 0 chosen).
      reference: float ``[B, 2, T]``, the same under the frozen reference (not differentiated
        here; callers stop its gradient).
      mask: bool ``[B, 2, T]``, the targets that are completion tokens.
      beta: the positive DPO temperature.
      nll_weight: RPO's ``alpha``; ``alpha * chosen_nll(policy, mask)`` joins the mean loss
        (TRL's ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, alpha]``).
    Returns:
      ``(mean loss over the B pairs, metrics)`` with the metric means described in the
      module docstring. Values at masked positions never reach the result, even when not
      finite.
    """
    loss = preference_logsigmoid(
        policy[:, 0],
        policy[:, 1],
        reference[:, 0],
        reference[:, 1],
        mask[:, 0],
        mask[:, 1],
        beta,
    )
    policy_sums = sequence_log_prob(jax.lax.stop_gradient(policy), mask)
    reference_sums = sequence_log_prob(reference, mask)
    rewards = beta * (policy_sums - reference_sums)
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    metrics = {
        "rewards/chosen": jnp.mean(chosen),
        "rewards/rejected": jnp.mean(rejected),
        "rewards/accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
        "rewards/margin": jnp.mean(chosen - rejected),
        "logps/chosen": jnp.mean(policy_sums[:, 0]),
        "logps/rejected": jnp.mean(policy_sums[:, 1]),
    }
    nll = chosen_nll(policy, mask)
    metrics["nll/chosen"] = jax.lax.stop_gradient(nll)
    if nll_weight:
        loss = loss + nll_weight * nll
    return loss, metrics


class DPOObjective:
    """Sigmoid DPO over preference pairs (see the module docstring for batch and metrics).

    Args:
      model: a flax module with ``apply(variables, ids, segment_ids=, positions=)`` returning
        float logits ``[B, T, V]``.
      seq_len: ``T``; batches carry ``T + 1`` ids per side (``PreferencePairs.seq_len - 1``).
      beta: positive temperature of the preference comparison.
      pretrained: full variables ``{"params": ...}`` to start from; they also become the
        frozen reference. Without it the model is freshly initialized (and that start is the
        reference).
      ema_decay: only ``1.0`` is accepted: the reference in ``TrainState.ema`` never moves.
      nll_weight: RPO's ``alpha``, the weight of the chosen side's token-mean NLL added to
        each pair's loss (0, the default, is plain DPO).
    """

    #: The metrics the console line shows (``dew.progress.Progress``).
    key_metrics = ("loss", "rewards/accuracy", "rewards/margin")

    def __init__(
        self,
        model: Any,
        seq_len: int,
        beta: float = 0.1,
        pretrained: Any = None,
        ema_decay: float = 1.0,
        nll_weight: float = 0.0,
    ) -> None:
        if not is_int(seq_len) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        if not is_real(beta) or not beta > 0:
            raise ValueError(f"beta: expected a positive number, got {beta!r}")
        if not math.isfinite(beta):
            raise ValueError(f"beta: expected a finite number, got {beta!r}")
        if not is_real(nll_weight) or not math.isfinite(nll_weight) or nll_weight < 0:
            raise ValueError(f"nll_weight: expected a finite number >= 0, got {nll_weight!r}")
        if isinstance(ema_decay, bool) or ema_decay != 1.0:
            raise ValueError(
                "ema_decay: DPO keeps its reference frozen in TrainState.ema, so the decay is "
                f"fixed at 1.0; got {ema_decay!r}"
            )
        self.model = model
        self.seq_len = seq_len
        self.beta = float(beta)
        self.nll_weight = float(nll_weight)
        self.pretrained = validate_pretrained(pretrained)

    token_fields = ("input_ids",)  # the batch column counted as tokens (see objectives.base)

    @property
    def width(self) -> int:
        """Ids per side of a pair (``seq_len + 1``, the ``PreferencePairs`` row width)."""
        return self.seq_len + 1

    @property
    def ema_decay(self) -> float:
        """Always 1.0: the starting variables stay in ``TrainState.ema`` as the reference."""
        return 1.0

    def init(self, key: jax.Array) -> dict[str, Any]:
        """``pretrained`` when given, else fresh variables of ``model``."""
        return initial_variables(self.model, self.pretrained, key, self.seq_len)

    def _check(self, batch: dict[str, jax.Array]) -> None:
        want = self.seq_len + 1
        for name in _FIELDS:
            if name not in batch:
                raise KeyError(f"batch: DPOObjective needs {name!r}, got fields {sorted(batch)}")
            shape = tuple(batch[name].shape)
            if len(shape) != 3 or shape[1] != 2 or shape[2] != want:
                raise ValueError(
                    f"batch[{name!r}]: expected shape [B, 2, {want}] (pairs, chosen/rejected, "
                    f"seq_len + 1), got {shape}"
                )

    def _token_log_probs(self, variables: Any, input_ids: jax.Array) -> jax.Array:
        """Per-target log-probs ``[B, 2, T]`` of ``input_ids`` ``[B, 2, T + 1]``."""
        pairs = input_ids.shape[0]
        flat = input_ids.reshape(2 * pairs, -1).astype(jnp.int32)
        logits = self.model.apply(variables, flat[:, :-1])
        return target_log_probs(logits, flat[:, 1:]).reshape(pairs, 2, -1)

    def loss(
        self,
        variables: Any,
        batch: dict[str, jax.Array],
        key: jax.Array,
        reference: Any = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(sum of the pair losses, number of pairs, metrics)`` for one (micro)batch."""
        del key
        if reference is None:
            raise ValueError(
                "reference: DPOObjective needs the frozen reference variables "
                "(TrainState.ema); got None"
            )
        self._check(batch)
        input_ids = batch["input_ids"]
        mask = batch["completion_mask"][:, :, 1:] > 0
        policy = self._token_log_probs(variables, input_ids)
        ref = jax.lax.stop_gradient(self._token_log_probs(reference, input_ids))
        mean_loss, metrics = dpo_terms(policy, ref, mask, self.beta, self.nll_weight)
        pairs = input_ids.shape[0]
        return mean_loss * pairs, jnp.asarray(pairs, jnp.float32), metrics

    def evaluate(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Sums over the chosen completions: ``loss`` (NLL), ``correct`` and ``weight``."""
        del key
        self._check(batch)
        ids = batch["input_ids"][:, 0].astype(jnp.int32)
        mask = batch["completion_mask"][:, 0, 1:] > 0
        logits = self.model.apply(variables, ids[:, :-1])
        nll, correct = token_nll(logits, ids[:, 1:])
        return nll_sums(nll, correct, mask)

    @staticmethod
    def summarize_evaluation(totals: dict[str, float]) -> dict[str, float]:
        """Token loss, perplexity and accuracy on the chosen completions."""
        return summarize_nll(totals, accuracy=True)

"""LMObjective: next-token cross-entropy for pretraining and SFT on packed rows.

Batch fields (``L`` = ``seq_len``):

- ``text`` int ``[B, L + 1]``: token ids; input position ``i`` predicts token ``i + 1``.
- ``text_segment_ids`` int ``[B, L + 1]`` (optional): document id per token, 0 for padding.
  A prediction counts only when its input and target share a nonzero segment, so padding
  and the jump from one packed document to the next are skipped.
- ``text_positions`` int ``[B, L + 1]`` (optional): position inside each document; derived
  from the segment ids when absent.
- ``text_roles`` int ``[B, L + 1]`` (required when ``loss_role`` is set): the role of each
  token (``dew.data.chat.Role``). Ids and roles shift together: the prediction of token
  ``i + 1`` counts when ``text_roles[:, i + 1] == loss_role``.

``loss`` returns ``(sum of token NLL, number of counted targets, metrics)`` following the
protocol in ``dew.objectives.base``; ``evaluate`` returns sums that the Trainer turns into
token loss, perplexity (``exp`` of the mean token loss) and accuracy.

The token NLL comes from ``dew.objectives.scoring.token_nll`` (float32, no second
``[B, L, V]`` array of log-probabilities).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.base import initial_variables, validate_ema_decay, validate_pretrained
from dew.objectives.scoring import (
    check_text_batch,
    nll_sums,
    positions_from_segments,
    same_chain,
    summarize_nll,
    token_nll,
)


class LMObjective:
    """Next-token loss over ``text`` (see the module docstring for the batch).

    Args:
      model: a flax module with ``apply(variables, ids, segment_ids=, positions=)`` -> logits.
      seq_len: ``L``; batches carry ``L + 1`` tokens per row.
      pretrained: a full variables mapping ``{"params": ...}`` to start from.
      loss_role: count only targets of this role (``None``: every real target).
      ema_decay: ``None`` (the default: no EMA, so no second copy of the weights is kept or
        checkpointed), or a decay in ``(0, 1]`` (a moving average in ``TrainState.ema``).
    """

    token_fields = ("text",)  # the batch column counted as tokens (see objectives.base)

    # (logits [B, T, V], targets [B, T]) -> (nll, correct); a subclass may swap it (benchmarks do)
    token_nll = staticmethod(token_nll)

    def __init__(
        self,
        model: Any,
        seq_len: int,
        pretrained: Any = None,
        loss_role: int | None = None,
        ema_decay: float | None = None,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        self.model = model
        self.seq_len = seq_len
        self.pretrained = validate_pretrained(pretrained)
        self.loss_role = None if loss_role is None else int(loss_role)
        self.ema_decay = validate_ema_decay(ema_decay)

    @property
    def width(self) -> int:
        """Ids per row (``seq_len + 1``)."""
        return self.seq_len + 1

    def init(self, key: jax.Array) -> dict[str, Any]:
        return initial_variables(self.model, self.pretrained, key, self.seq_len)

    def _check(self, batch: dict[str, jax.Array]) -> None:
        check_text_batch(
            batch,
            "LMObjective",
            self.seq_len + 1,
            ("text", "text_segment_ids", "text_positions", "text_roles"),
        )
        if self.loss_role is not None and "text_roles" not in batch:
            raise KeyError(
                f"batch: loss_role={self.loss_role} needs a 'text_roles' field, got {sorted(batch)}"
            )

    def _token_terms(self, variables: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        self._check(batch)
        text = batch["text"].astype(jnp.int32)
        inputs, targets = text[:, :-1], text[:, 1:]
        seg = batch.get("text_segment_ids")
        pos = batch.get("text_positions")
        if seg is not None and pos is None:
            pos = positions_from_segments(seg)
        logits = self.model.apply(
            variables,
            inputs,
            segment_ids=None if seg is None else seg[:, :-1].astype(jnp.int32),
            positions=None if pos is None else pos[:, :-1].astype(jnp.int32),
        )
        nll, correct = self.token_nll(logits, targets)
        mask = jnp.ones(targets.shape, bool)
        if seg is not None:
            mask = same_chain(seg)
        if self.loss_role is not None:
            mask = mask & (batch["text_roles"][:, 1:] == self.loss_role)
        return nll_sums(nll, correct, mask)

    def loss(
        self,
        variables: Any,
        batch: dict[str, jax.Array],
        key: jax.Array,
        reference: Any = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(sum of target NLL, counted targets, {"accuracy_sum": correct targets})``."""
        del key, reference
        sums = self._token_terms(variables, batch)
        return sums["loss"], sums["weight"], {"accuracy_sum": sums["correct"]}

    def evaluate(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Sums for validation: ``loss`` (NLL), ``correct`` and ``weight`` (targets)."""
        del key
        return self._token_terms(variables, batch)

    @staticmethod
    def summarize_evaluation(totals: dict[str, float]) -> dict[str, float]:
        """Token loss, perplexity and accuracy from summed ``evaluate`` outputs."""
        return summarize_nll(totals, accuracy=True)

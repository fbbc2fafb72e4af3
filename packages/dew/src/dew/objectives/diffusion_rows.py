"""What the two diffusion language-model objectives share around their noising.

``MaskedDiffusionObjective`` (MDLM) and ``BlockDiffusionObjective`` (BD3-LM) differ in how
they noise a row and what the model reads; everything around that is this base class:

- ``width``, ``init``: rows of ``seq_len + 1`` ids, as ``TokenFile`` and ``LMObjective``
  use them (the diffusion row is the first ``seq_len``; the last id is unused);
- ``rows(batch)``: the checked batch as ``(tokens [B, L], segment ids [B, L] or None,
  positions [B, L] or None, real bool [B, L])``; positions come from the segment ids when
  only those are given, and stay None when neither is (the decoder counts ``0 .. L - 1``);
  padding (segment id 0) is not real and is never masked nor counted;
- ``loss`` and ``evaluate`` from the subclass's ``token_losses(variables, batch, key) ->
  (loss [B, L], real [B, L], masked [B, L])``: the summed weighted NLL over the number of
  real tokens, so the Trainer's loss is the NLL bound in nats per token, with the bound in
  bits (``bits_per_token``) and the masked count as metrics.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.base import initial_variables
from dew.objectives.scoring import check_text_batch, positions_from_segments

LN2 = math.log(2.0)
FIELDS = ("text", "text_segment_ids", "text_positions")


class DiffusionRows:
    """Base of the diffusion objectives (see the module docstring); subclasses set
    ``model``, ``seq_len`` and ``pretrained`` and define ``token_losses``."""

    token_fields = ("text",)
    model: Any
    seq_len: int
    pretrained: Any

    @property
    def width(self) -> int:
        """Ids per row (``seq_len + 1``, the readers' row width)."""
        return self.seq_len + 1

    def init(self, key: jax.Array) -> dict[str, Any]:
        return initial_variables(self.model, self.pretrained, key, self.seq_len)

    def rows(
        self, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array | None, jax.Array | None, jax.Array]:
        """``(tokens, segment ids, positions, real)`` of the batch's first ``seq_len`` ids."""
        check_text_batch(batch, type(self).__name__, self.width, FIELDS)
        n = self.seq_len
        tokens = batch["text"][:, :n].astype(jnp.int32)
        seg = batch.get("text_segment_ids")
        pos = batch.get("text_positions")
        if seg is not None and pos is None:
            pos = positions_from_segments(seg)
        real = jnp.ones(tokens.shape, bool) if seg is None else seg[:, :n] != 0
        seg = None if seg is None else seg[:, :n].astype(jnp.int32)
        pos = None if pos is None else pos[:, :n].astype(jnp.int32)
        return tokens, seg, pos, real

    def token_losses(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        raise NotImplementedError

    def loss(
        self,
        variables: Any,
        batch: dict[str, jax.Array],
        key: jax.Array,
        reference: Any = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(sum of weighted NLL, real tokens, {"bits_per_token_sum", "masked_sum"})``."""
        del reference
        loss, real, masked = self.token_losses(variables, batch, key)
        total = jnp.sum(loss)
        metrics = {
            "bits_per_token_sum": total / LN2,
            "masked_sum": jnp.sum(masked).astype(jnp.float32),
        }
        return total, jnp.sum(real).astype(jnp.float32), metrics

    def evaluate(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Sums for validation (one noising per row): ``loss``, ``bits_per_token``, ``weight``."""
        loss, real, _ = self.token_losses(variables, batch, key)
        total = jnp.sum(loss)
        return {
            "loss": total,
            "bits_per_token": total / LN2,
            "weight": jnp.sum(real).astype(jnp.float32),
        }


__all__ = ["FIELDS", "LN2", "DiffusionRows"]

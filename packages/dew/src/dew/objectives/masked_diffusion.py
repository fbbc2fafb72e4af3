"""MaskedDiffusionObjective: MDLM's masked diffusion loss on a bidirectional decoder.

Reference: Sahoo et al. 2024 (MDLM), github.com/kuleshov-group/mdlm; the math is in
``dew.objectives.diffusion``. Each row draws a time ``t`` (antithetic over the batch), its
real tokens are masked independently with probability ``1 - exp(-sigma(t))``, the model
reads the noisy row with ``causal=False`` and the loss is the continuous-time ELBO: the
NLL of the true token at each masked position (SUBS: the mask id is never predicted)
weighted by ``sigma'(t) / expm1(sigma(t))``. The model is not told ``t`` (MDLM trains
without time conditioning by default).

Batch fields, as ``TokenFile`` and ``LMObjective`` use them (``L`` = ``seq_len``):

- ``text`` int ``[B, L + 1]``: token ids. The diffusion sequence is the row's first ``L``
  ids, so the model reads exactly the shape ``LMObjective`` gives it and the same reader,
  model and ``max_seq_len`` serve both objectives; the last id of each row is unused.
- ``text_segment_ids`` int ``[B, L + 1]`` (optional): document id per token, 0 for padding.
  Each token attends to its own document only; padding is never masked nor counted.
- ``text_positions`` int ``[B, L + 1]`` (optional): derived from the segment ids when absent.

``loss`` returns ``(sum of weighted NLL, number of real tokens, metrics)``: the Trainer's
``loss`` is then MDLM's NLL bound in nats per token (the average over every real token,
masked or not, as MDLM's ``_loss`` divides by the attention mask's count), the metric
``bits_per_token`` the same bound in bits and ``masked`` the fraction of real tokens masked.
One draw of times and masks per call makes the bound a stochastic estimate, in training and
in ``evaluate`` alike. The mask id must lie outside the ids the data
holds (``real_tokens``) and inside the model's vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax

from dew.objectives.base import validate_ema_decay, validate_pretrained
from dew.objectives.diffusion import (
    Schedule,
    diffusion_nll,
    mask_tokens,
    sample_times,
    schedule_named,
)
from dew.objectives.diffusion_rows import DiffusionRows


def check_mask_id(mask_id: Any, real_tokens: Any, vocab_size: int | None) -> int:
    """``mask_id`` as an int after checking ``real_tokens <= mask_id < vocab_size``.

    real_tokens: how many ids (``0 .. real_tokens - 1``) the data may hold. vocab_size: the
    model's embedding rows, or ``None`` when the model does not say.
    """
    for name, value in (("mask_id", mask_id), ("real_tokens", real_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
    if mask_id < real_tokens:
        raise ValueError(
            f"mask_id: {mask_id} is inside the vocabulary's real tokens 0..{real_tokens - 1}; "
            f"use an id >= {real_tokens} that the data never holds"
        )
    if vocab_size is not None and mask_id >= vocab_size:
        raise ValueError(f"mask_id: {mask_id} is outside the model's vocab_size={vocab_size}")
    return mask_id


class MaskedDiffusionObjective(DiffusionRows):
    """Masked (absorbing-state) diffusion loss over ``text`` (see the module docstring).

    Args:
      model: a flax module with ``apply(variables, ids, segment_ids=, positions=,
        causal=False)`` -> logits ``[B, T, V]`` (``CausalTransformer`` does).
      seq_len: ``L``; batches carry ``L + 1`` ids per row and the model reads the first ``L``.
      mask_id: the absorbing id, ``>= real_tokens`` and below the model's vocab_size.
      real_tokens: how many ids the data may hold (``0 .. real_tokens - 1``).
      schedule: ``"loglinear"`` (the default, MDLM's), ``"cosine"`` or a ``Schedule``.
      eps: the schedule's eps and the smallest time drawn (MDLM's ``sampling_eps``).
      antithetic: stratify the batch's times (MDLM's default).
      pretrained: a full variables mapping ``{"params": ...}`` to start from.
      ema_decay: ``None`` (no EMA) or a decay in ``(0, 1]``.
    """

    def __init__(
        self,
        model: Any,
        seq_len: int,
        mask_id: int,
        real_tokens: int,
        schedule: str | Schedule = "loglinear",
        eps: float = 1e-3,
        antithetic: bool = True,
        pretrained: Any = None,
        ema_decay: float | None = None,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        config = getattr(model, "config", None)
        vocab = getattr(config, "vocab_size", None)
        self.mask_id = check_mask_id(mask_id, real_tokens, vocab)
        self.real_tokens = real_tokens
        self.schedule = schedule_named(schedule, eps)
        self.eps = float(eps)
        self.antithetic = bool(antithetic)
        self.model = model
        self.seq_len = seq_len
        self.pretrained = validate_pretrained(pretrained)
        self.ema_decay = validate_ema_decay(ema_decay)

    def token_losses(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(loss [B, L], real bool [B, L], masked bool [B, L])`` for one noising of the batch."""
        tokens, seg, pos, real = self.rows(batch)
        time_key, mask_key = jax.random.split(key)
        times = sample_times(time_key, tokens.shape[0], self.eps, self.antithetic)
        chance = self.schedule.move_chance(times)
        noisy, masked = mask_tokens(mask_key, tokens, chance, self.mask_id, real)
        logits = self.model.apply(
            variables,
            noisy,
            segment_ids=seg,
            positions=pos,
            causal=False,
        )
        loss = diffusion_nll(logits, tokens, masked, times, self.mask_id, self.schedule)
        return loss, real, masked


__all__ = ["MaskedDiffusionObjective", "check_mask_id"]

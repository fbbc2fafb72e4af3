"""BlockDiffusionObjective: BD3-LM's block diffusion loss in one two-copy pass.

Reference: Arriola et al. 2025, "Block Diffusion: Interpolating Between Autoregressive and
Diffusion Language Models" (BD3-LM), github.com/kuleshov-group/bd3lms (``diffusion.py``:
``_sample_t``, ``q_xt``, ``_forward_pass_diffusion``, ``_loss``; ``noise_schedule.py``:
``LogLinearNoise``; ``models/dit.py``: ``block_diff_mask``).

A row of ``L`` tokens is cut into ``L / S`` blocks of ``S`` positions. Each block draws one
time ``t`` (antithetic over every block of the batch, clipped to ``[mask_rate_min,
mask_rate_max]``); each of its real tokens is masked with probability ``t`` (BD3-LM's
log-linear schedule: the mask rate is ``t`` itself). The model reads ``[x_t, x_0]``, the
noised row and then the clean row, in one pass of length ``2L`` with both copies at
positions ``0..L-1`` and ``dew.models.layers.two_copy_visible``'s rule: a noised block sees
itself and the clean blocks before it. The loss is on the noised copy's logits only: at each
masked token ``-log p(x_0)`` under SUBS (the mask id is never predicted) weighted by
``1 / t``; unmasked tokens cost 0. As in BD3-LM, a lower clip above 0.5 weighs every masked
token by 1 instead, so ``S = 1`` with ``mask_rate_min = mask_rate_max = 1`` masks every token
with weight 1: the loss is then the next-token NLL of the model that reads the clean prefix
and the mask id at the predicted position (BD3-LM's autoregressive limit).

Batch fields are ``MaskedDiffusionObjective``'s: ``text`` int ``[B, L + 1]`` (the first
``L`` ids are the row; the last is unused), optional ``text_segment_ids`` (0 = padding,
never masked nor counted; blocks restart at each document's first token) and
``text_positions``. ``loss`` returns ``(sum of weighted NLL, number of real tokens, metrics)``
(``bits_per_token_sum``, ``masked_sum``), so the Trainer's ``loss`` is the bound in nats per
token, as BD3-LM's ``_loss`` divides by the attention mask's count. Not implemented:
BD3-LM's ``ignore_bos`` (keep the first token unmasked), its ``resample`` of blocks whose
masked fraction falls outside the clip, and time conditioning.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.base import validate_ema_decay, validate_pretrained
from dew.objectives.diffusion import MASK_LOGIT_OFFSET
from dew.objectives.diffusion_rows import DiffusionRows
from dew.objectives.masked_diffusion import check_mask_id


def block_times_from_uniform(
    u: jax.Array, rate_min: float, rate_max: float, antithetic: bool = True
) -> jax.Array:
    """Times ``[B, N]`` (one per block) from uniform draws ``u`` ``[B, N]`` (``_sample_t``).

    Antithetic: the ``B * N`` blocks, in row-major order, take one stratum each,
    ``(u / (B N) + k / (B N)) mod 1``. Then ``t = u (rate_max - rate_min) + rate_min``, or
    exactly 1 when both bounds are at least 1.
    """
    u = u.astype(jnp.float32)
    if antithetic:
        n = u.size
        offset = jnp.arange(n, dtype=jnp.float32).reshape(u.shape) / n
        u = jnp.mod(u / n + offset, 1.0)
    if rate_min >= 1.0 and rate_max >= 1.0:
        return jnp.ones_like(u)
    return u * (rate_max - rate_min) + rate_min


def token_times(times: jax.Array, positions: jax.Array, size: int) -> jax.Array:
    """Each token's block time ``[B, L]`` from block times ``[B, L / S]`` and positions ``[B, L]``.

    A token's block starts at row index ``i - positions % S`` (the document's own blocks);
    its time is the one drawn for the row block holding that start. Without packing this
    is ``times[:, i // S]``; packed blocks that start in the same row block share a time.
    """
    idx = jnp.arange(positions.shape[1], dtype=jnp.int32)[None, :]
    start = jnp.maximum(idx - positions.astype(jnp.int32) % size, 0)
    return jnp.take_along_axis(times, start // size, axis=1)


def loss_weights(t: jax.Array, rate_min: float) -> jax.Array:
    """The weight of a masked token's NLL: ``1 / t``, or 1 when ``rate_min > 0.5`` (BD3-LM)."""
    if rate_min > 0.5:
        return jnp.ones_like(t)
    return 1.0 / t


def block_diffusion_nll(
    logits: jax.Array,
    tokens: jax.Array,
    masked: jax.Array,
    t: jax.Array,
    mask_id: int,
    rate_min: float,
) -> jax.Array:
    """BD3-LM's per-token loss, float32 ``[B, L]``.

    logits ``[B, L, V]`` (the noised copy's), tokens int ``[B, L]`` (clean ids), masked bool
    ``[B, L]``, t ``[B, L]`` (each token's block time). A masked token costs
    ``loss_weights(t) * -log p(token)`` with ``p`` the softmax without the mask id (SUBS);
    every other token 0, as SUBS carries it over with log-probability 0.
    """
    logits = logits.astype(jnp.float32)
    shifted = logits.at[..., mask_id].add(MASK_LOGIT_OFFSET)
    picked = jnp.take_along_axis(shifted, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    nll = jax.nn.logsumexp(shifted, axis=-1) - picked
    weight = loss_weights(t.astype(jnp.float32), rate_min)
    return jnp.where(masked, nll * weight, 0.0)


def _check_rates(rate_min: Any, rate_max: Any) -> tuple[float, float]:
    for name, value in (("mask_rate_min", rate_min), ("mask_rate_max", rate_max)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            raise ValueError(f"{name}: expected a number in (0, 1], got {value!r}")
    if rate_min > rate_max:
        raise ValueError(f"mask_rate_min: expected <= mask_rate_max={rate_max}, got {rate_min}")
    return float(rate_min), float(rate_max)


def check_block_size(block_size: Any, seq_len: int) -> int:
    """``block_size`` as an int after checking that it is positive and divides ``seq_len``."""
    if (
        not isinstance(block_size, int)
        or isinstance(block_size, bool)
        or block_size < 1
        or seq_len % block_size
    ):
        raise ValueError(
            f"block_size: expected a positive int dividing seq_len={seq_len}, got {block_size!r}"
        )
    return block_size


class BlockDiffusionObjective(DiffusionRows):
    """BD3-LM's block diffusion loss over ``text`` (see the module docstring).

    Args:
      model: a flax module with ``apply(variables, ids [B, 2L], segment_ids=, positions=,
        causal=False, block_size=S, two_copy=True)`` -> the noised copy's logits
        ``[B, L, V]`` (``CausalTransformer`` does).
      seq_len: ``L``; batches carry ``L + 1`` ids per row and the model reads the first ``L``.
      block_size: ``S``, dividing ``seq_len``; 1 is the autoregressive limit, ``L`` MDLM-like.
      mask_id: the absorbing id, ``>= real_tokens`` and below the model's vocab_size.
      real_tokens: how many ids the data may hold (``0 .. real_tokens - 1``).
      mask_rate_min, mask_rate_max: BD3-LM's clipped schedule (``sampling_eps_min`` and
        ``sampling_eps_max``), ``0 < min <= max <= 1``; the default is its ``[1e-3, 1]``.
      antithetic: stratify the batch's block times (BD3-LM's default).
      pretrained: a full variables mapping ``{"params": ...}`` to start from.
      ema_decay: ``None`` (no EMA) or a decay in ``(0, 1]``.
    """

    def __init__(
        self,
        model: Any,
        seq_len: int,
        block_size: int,
        mask_id: int,
        real_tokens: int,
        mask_rate_min: float = 1e-3,
        mask_rate_max: float = 1.0,
        antithetic: bool = True,
        pretrained: Any = None,
        ema_decay: float | None = None,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        self.block_size = check_block_size(block_size, seq_len)
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        self.mask_id = check_mask_id(mask_id, real_tokens, vocab)
        self.real_tokens = real_tokens
        self.mask_rate_min, self.mask_rate_max = _check_rates(mask_rate_min, mask_rate_max)
        self.antithetic = bool(antithetic)
        self.model = model
        self.seq_len = seq_len
        self.pretrained = validate_pretrained(pretrained)
        self.ema_decay = validate_ema_decay(ema_decay)

    def _noise(
        self, key: jax.Array, tokens: jax.Array, pos: jax.Array, real: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(noisy ids, masked, t per token)``, each ``[B, L]``, for one draw of ``key``."""
        b, n = tokens.shape
        time_key, mask_key = jax.random.split(key)
        u = jax.random.uniform(time_key, (b, n // self.block_size), jnp.float32)
        times = block_times_from_uniform(u, self.mask_rate_min, self.mask_rate_max, self.antithetic)
        t = token_times(times, pos, self.block_size)
        draws = jax.random.uniform(mask_key, tokens.shape, jnp.float32)
        masked = (draws <= t) & real
        return jnp.where(masked, self.mask_id, tokens), masked, t

    def token_losses(
        self, variables: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(loss [B, L], real bool [B, L], masked bool [B, L])`` for one noising of the batch."""
        tokens, seg, pos, real = self.rows(batch)
        if pos is None:
            pos = jnp.broadcast_to(jnp.arange(self.seq_len, dtype=jnp.int32), tokens.shape)
        noisy, masked, t = self._noise(key, tokens, pos, real)
        seg2 = None if seg is None else jnp.tile(seg, (1, 2))
        logits = self.model.apply(
            variables,
            jnp.concatenate([noisy, tokens], axis=1),
            segment_ids=seg2,
            positions=jnp.tile(pos, (1, 2)),
            causal=False,
            block_size=self.block_size,
            two_copy=True,
        )
        loss = block_diffusion_nll(logits, tokens, masked, t, self.mask_id, self.mask_rate_min)
        return loss, real, masked


__all__ = [
    "BlockDiffusionObjective",
    "block_diffusion_nll",
    "block_times_from_uniform",
    "check_block_size",
    "loss_weights",
    "token_times",
]

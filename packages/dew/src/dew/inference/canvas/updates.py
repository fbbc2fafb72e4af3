"""One step of canvas generation as pure functions of arrays (no model, no loop).

Shapes: canvas int `[B, W]`, logits float `[B, W, V]`, uniforms float32 `[B, W, V]` (the
step's draws, in [0, 1)), region bool `[W]` (the current block's positions).

- `filtered(logits, sampling, mask_id)`: the logits a draw reads: the mask id removed,
  softcap, then top-k, top-p and min-p as `dew.sampling.draw` applies them (ids filtered
  out get -inf); no temperature.
- `categorical(probs, uniforms)`: MDLM's `_sample_categorical`: the argmax of
  `probs / (1e-10 - log(u + 1e-10))`, an exponential race, so unnormalised weights work.
- `ancestral(...)`: MDLM's `_ddpm_update` on the region.
- `low_confidence(...)`: LLaDA's `add_gumbel_noise` draw and 'low_confidence' transfer.
- `denoise(...)`: MDLM's `noise_removal`: the most likely id at every masked position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.sampling import Sampling, first_argmax


def without_mask(logits: jax.Array, mask_id: int) -> jax.Array:
    """float32 logits with the mask id's set to -inf (it is never drawn)."""
    logits = logits.astype(jnp.float32)
    return logits.at[..., mask_id].set(-jnp.inf)


def filtered(logits: jax.Array, sampling: Sampling, mask_id: int) -> jax.Array:
    """The logits `[..., V]` a draw reads (see the module docstring); temperature not applied."""
    x = without_mask(logits, mask_id)
    if sampling.softcap is not None:
        cap = jnp.float32(sampling.softcap)
        x = cap * jnp.tanh(x / cap)
    if sampling.top_k is None and sampling.top_p == 1 and sampling.min_p == 0:
        return x
    k = min(sampling.top_k or x.shape[-1], x.shape[-1])
    values, candidates = jax.lax.top_k(x, k)
    keep = jnp.isfinite(values)
    scaled = values / jnp.float32(sampling.temperature or 1.0)
    if sampling.top_p < 1:
        probs = jax.nn.softmax(scaled, axis=-1)
        keep = keep & (jnp.cumsum(probs, axis=-1) - probs < sampling.top_p)
    if sampling.min_p > 0:
        probs = jax.nn.softmax(jnp.where(keep, scaled, -jnp.inf), axis=-1)
        keep = keep & (probs >= sampling.min_p * probs[..., :1])
    kept = jnp.put_along_axis(jnp.zeros(x.shape, bool), candidates, keep, axis=-1, inplace=False)
    return jnp.where(kept, x, -jnp.inf)


def categorical(probs: jax.Array, uniforms: jax.Array) -> jax.Array:
    """int32 `[...]`: one id per row of non-negative weights `[..., V]` (MDLM's race)."""
    race = probs / (1e-10 - jnp.log(uniforms + 1e-10))
    return first_argmax(race)


def ancestral(
    canvas: jax.Array,
    logits: jax.Array,
    uniforms: jax.Array,
    region: jax.Array,
    mask_id: int,
    move_t: jax.Array,
    move_s: jax.Array,
    sampling: Sampling,
) -> jax.Array:
    """MDLM's ancestral step from time `t` to `s < t` on the region's masked positions.

    move_t, move_s: float32 scalars, the schedule's mask probabilities at `t` and `s`. The
    weights are `p(x) (move_t - move_s)` for each id and `move_s` for the mask id, `p` the
    model's distribution after `filtered` and the temperature (temperature 0: all its
    mass on the most likely id). Unmasked positions and positions outside the region are
    carried over. Returns the new canvas `[B, W]`.
    """
    x = filtered(logits, sampling, mask_id)
    if sampling.greedy:
        probs = jax.nn.one_hot(first_argmax(x), x.shape[-1], dtype=jnp.float32)
    else:
        probs = jnp.exp(jax.nn.log_softmax(x / jnp.float32(sampling.temperature), axis=-1))
    weights = probs * (move_t - move_s)
    weights = weights.at[..., mask_id].set(move_s)
    drawn = categorical(weights, uniforms)
    open_ = (canvas == mask_id) & region[None, :]
    return jnp.where(open_, drawn, canvas)


def low_confidence(
    canvas: jax.Array,
    logits: jax.Array,
    uniforms: jax.Array,
    region: jax.Array,
    count: jax.Array,
    mask_id: int,
    sampling: Sampling,
) -> jax.Array:
    """LLaDA's step: unmask the `count` most confident masked positions of the region.

    Each masked position draws `argmax(x - T log(-log u))` over `filtered` logits `x`
    (LLaDA's `logits.exp() / (-log u) ** T`; temperature 0: the argmax), and its confidence
    is the softmax of the unfiltered logits (mask id included, as LLaDA computes it) at the
    drawn id. count: int32 scalar; ties in confidence go to the lower position. Returns the
    new canvas `[B, W]`.
    """
    x = filtered(logits, sampling, mask_id)
    if not sampling.greedy:
        x = x - jnp.float32(sampling.temperature) * jnp.log(-jnp.log(uniforms))
    drawn = first_argmax(x)
    raw = logits.astype(jnp.float32)
    if sampling.softcap is not None:
        cap = jnp.float32(sampling.softcap)
        raw = cap * jnp.tanh(raw / cap)
    probs = jax.nn.softmax(raw, axis=-1)
    confidence = jnp.take_along_axis(probs, drawn[..., None], axis=-1)[..., 0]
    open_ = (canvas == mask_id) & region[None, :]
    confidence = jnp.where(open_, confidence, -jnp.inf)
    order = jnp.argsort(-confidence, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1)
    transfer = open_ & (rank < count)
    return jnp.where(transfer, drawn, canvas)


def denoise(canvas: jax.Array, logits: jax.Array, region: jax.Array, mask_id: int) -> jax.Array:
    """MDLM's noise removal: each masked position of the region takes its most likely id."""
    best = first_argmax(without_mask(logits, mask_id))
    return jnp.where((canvas == mask_id) & region[None, :], best, canvas)


def transfer_counts(length: int, steps: int) -> jax.Array:
    """int32 `[steps]`: LLaDA's `get_num_transfer_tokens` for a block of `length` masked
    positions: `length // steps` each, one more for the first `length % steps` steps."""
    base, extra = divmod(length, steps)
    return jnp.full((steps,), base, jnp.int32) + (jnp.arange(steps) < extra).astype(jnp.int32)

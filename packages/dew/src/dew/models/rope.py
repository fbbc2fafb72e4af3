"""Rotary position embeddings (RoPE) with the checkpoint's base and scaling.

Ported from transformers 5.x `modeling_rope_utils` (`_compute_default_rope_parameters`,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`) and the
`rotate_half` convention of `modeling_llama.apply_rotary_pos_emb`: a head of width
Dh is split into two halves, and channel i of the first half rotates together with
channel i of the second half at frequency `inv_freq[i]`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.models.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """Per-channel-pair angular frequencies, float32 `[head_dim // 2]`.

    Computed in float32 on the host, the way transformers computes them, so that
    rotations match the reference bit for bit at small positions.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # `high_freq_wavelen` and `low_freq_wavelen` blended smoothly.
    factor = scaling.factor
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rotary_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables, float32 `[..., Dh]`, for integer `positions` of any shape."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rotate_half(x: jax.Array) -> jax.Array:
    """`[x1, x2] -> [-x2, x1]` over the last axis (transformers' `rotate_half`)."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate_half_transposed(v: jax.Array) -> jax.Array:
    """The transpose of `_rotate_half`: `[v1, v2] -> [v2, -v1]`."""
    half = v.shape[-1] // 2
    return jnp.concatenate([v[..., half:], -v[..., :half]], axis=-1)


def _heads(table: jax.Array, dtype: Any) -> jax.Array:
    return table[:, :, None, :].astype(dtype)


@jax.custom_vjp
def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate `x` `[B, T, heads, Dh]` by tables `[B, T, Dh]`; keeps x's dtype.

    `x * cos + rotate_half(x) * sin`. The backward pass is written out: the gradient of a
    rotation is the rotation transposed, `g * cos + rotate_half^T(g * sin)`, one pass of the
    same shape as the forward, where the generic rule pads and adds the two halves back
    (about four times slower on CPU). The tables get their exact cotangents too (summed
    over heads), which XLA drops when nothing upstream needs them.
    """
    return x * _heads(cos, x.dtype) + _rotate_half(x) * _heads(sin, x.dtype)


def _apply_rotary_fwd(
    x: jax.Array, cos: jax.Array, sin: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    return apply_rotary(x, cos, sin), (x, cos, sin)


def _apply_rotary_bwd(
    saved: tuple[jax.Array, jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    x, cos, sin = saved
    dx = g * _heads(cos, x.dtype) + _rotate_half_transposed(g * _heads(sin, x.dtype))
    dcos = jnp.sum((g * x).astype(jnp.float32), axis=2).astype(cos.dtype)
    dsin = jnp.sum((g * _rotate_half(x)).astype(jnp.float32), axis=2).astype(sin.dtype)
    return dx, dcos, dsin


apply_rotary.defvjp(_apply_rotary_fwd, _apply_rotary_bwd)

"""Rotary position embeddings (RoPE) with the checkpoint's base and scaling.

Ported from transformers 5.x `modeling_rope_utils` (`_compute_default_rope_parameters`,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`) and the
`rotate_half` convention of `modeling_llama.apply_rotary_pos_emb`: a head of width
Dh is split into two halves, and channel i of the first half rotates together with
channel i of the second half at frequency `inv_freq[i]`.
"""

from __future__ import annotations

import math

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


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate `x` `[B, T, heads, Dh]` by tables `[B, T, Dh]`; keeps x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin

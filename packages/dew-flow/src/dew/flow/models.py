"""Flow models in flax linen: ``SimpleDiT`` and the conditioning encoders.

``SimpleDiT`` is a small diffusion transformer (Peebles and Xie 2023): the image is cut into
``patch_size`` square patches, embedded with a learned position table, run through
``num_layers`` blocks of self-attention and MLP, and projected back to patches. The time (and
an optional condition vector) modulates every block with adaLN-zero: a zero-initialised linear
layer of the conditioning gives each block's shift, scale and gate, so every block starts as
the identity and the final projection starts at zero (the initial velocity is 0).

Encoders map one condition field to a ``[B, E]`` vector; :class:`Denoiser` sums the encoders'
vectors into the DiT's ``condition``.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

zeros = nn.initializers.zeros


def timestep_embedding(t: jax.Array, features: int, period: float = 10000.0) -> jax.Array:
    """``[B, features]`` sinusoidal embedding of ``t`` ``[B]`` (scaled by 1000 first)."""
    half = features // 2
    freqs = jnp.exp(-math.log(period) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
    args = 1000.0 * t.astype(jnp.float32)[:, None] * freqs[None, :]
    emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    if features % 2:
        emb = jnp.concatenate([emb, jnp.zeros_like(emb[:, :1])], axis=-1)
    return emb


def _modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    return x * (1.0 + scale[:, None, :]) + shift[:, None, :]


class DiTBlock(nn.Module):
    """Self-attention and MLP, each modulated and gated by the conditioning ``c`` ``[B, E]``."""

    num_heads: int
    mlp_ratio: float

    @nn.compact
    def __call__(self, x: jax.Array, c: jax.Array) -> jax.Array:
        features = x.shape[-1]
        mod = nn.Dense(6 * features, kernel_init=zeros, name="adaln")(nn.silu(c))
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(mod, 6, axis=-1)
        h = _modulate(
            nn.LayerNorm(use_bias=False, use_scale=False, name="norm1")(x), shift1, scale1
        )
        h = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name="attention")(h, h)
        x = x + gate1[:, None, :] * h
        h = _modulate(
            nn.LayerNorm(use_bias=False, use_scale=False, name="norm2")(x), shift2, scale2
        )
        hidden = max(1, int(round(features * self.mlp_ratio)))
        h = nn.Dense(hidden, name="mlp_in")(h)
        h = nn.Dense(features, name="mlp_out")(nn.gelu(h, approximate=True))
        return x + gate2[:, None, :] * h


class SimpleDiT(nn.Module):
    """A small DiT predicting the velocity ``[B, H, W, output_channels]``.

    ``__call__(x [B, H, W, C], t [B], condition [B, D] or None)``; ``H`` and ``W`` must be
    multiples of ``patch_size`` and ``emb_features`` of ``num_heads``.
    """

    output_channels: int
    patch_size: int = 2
    emb_features: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0

    @nn.compact
    def __call__(self, x: jax.Array, t: jax.Array, condition: jax.Array | None = None) -> jax.Array:
        b, height, width, _ = x.shape
        p, e = self.patch_size, self.emb_features
        if height % p or width % p:
            raise ValueError(
                f"SimpleDiT: image {height}x{width} is not a multiple of patch_size {p}"
            )
        if e % self.num_heads:
            raise ValueError(
                f"SimpleDiT: emb_features {e} is not a multiple of num_heads {self.num_heads}"
            )
        h = nn.Conv(e, (p, p), strides=(p, p), padding="VALID", name="patches")(x)
        gh, gw = height // p, width // p
        h = h.reshape(b, gh * gw, e)
        pos = self.param("position", nn.initializers.normal(0.02), (gh * gw, e), jnp.float32)
        h = h + pos[None]
        c = nn.Dense(e, name="time_in")(timestep_embedding(t, e))
        c = nn.Dense(e, name="time_out")(nn.silu(c))
        if condition is not None:
            c = c + nn.Dense(e, name="condition")(condition.astype(jnp.float32))
        for i in range(self.num_layers):
            h = DiTBlock(self.num_heads, self.mlp_ratio, name=f"block_{i}")(h, c)
        shift, scale = jnp.split(
            nn.Dense(2 * e, kernel_init=zeros, name="final_adaln")(nn.silu(c)), 2, -1
        )
        h = _modulate(
            nn.LayerNorm(use_bias=False, use_scale=False, name="final_norm")(h), shift, scale
        )
        h = nn.Dense(p * p * self.output_channels, kernel_init=zeros, name="final")(h)
        h = h.reshape(b, gh, gw, p, p, self.output_channels).transpose(0, 1, 3, 2, 4, 5)
        return h.reshape(b, height, width, self.output_channels)


class LabelEncoder(nn.Module):
    """Class labels ``[B]`` (ints in ``[0, num_classes)``) to ``[B, features]``."""

    num_classes: int
    features: int

    @nn.compact
    def __call__(self, labels: jax.Array) -> jax.Array:
        return nn.Embed(self.num_classes, self.features, name="table")(labels.astype(jnp.int32))


class TokenEncoder(nn.Module):
    """Token ids ``[B, L]`` (0 is padding) to ``[B, features]``: mean of their embeddings."""

    vocab_size: int
    features: int

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        ids = ids.astype(jnp.int32)
        emb = nn.Embed(self.vocab_size, self.features, name="table")(ids)
        real = (ids > 0)[..., None]
        total = jnp.sum(jnp.where(real, emb, 0.0), axis=1)
        return total / jnp.maximum(jnp.sum(real, axis=1), 1).astype(emb.dtype)


class Denoiser(nn.Module):
    """The flow model with its encoders: ``velocity = model(x, t, sum of encoder outputs)``.

    ``fields`` maps condition names to arrays; ``drop`` ``[B]`` (bool) zeroes a row's condition
    (the unconditional branch of classifier-free guidance). Without encoders the model is
    called without a condition.
    """

    model: nn.Module
    names: tuple[str, ...] = ()
    encoders: tuple[nn.Module, ...] = ()

    def __call__(
        self,
        x: jax.Array,
        t: jax.Array,
        fields: dict[str, Any] | None = None,
        drop: jax.Array | None = None,
    ) -> jax.Array:
        condition = None
        for name, encoder in zip(self.names, self.encoders):
            if fields is None or name not in fields:
                raise KeyError(f"batch[{name!r}]: missing; its encoder needs it")
            out = encoder(fields[name]).astype(jnp.float32)
            condition = out if condition is None else condition + out
        if condition is not None and drop is not None:
            condition = jnp.where(drop[:, None], 0.0, condition)
        return self.model(x, t, condition)


__all__ = [
    "DiTBlock",
    "Denoiser",
    "LabelEncoder",
    "SimpleDiT",
    "TokenEncoder",
    "timestep_embedding",
]

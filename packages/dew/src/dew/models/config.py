"""Hashable configuration of Dew's decoder family.

`DecoderConfig` holds every shape and numeric choice of a Llama/Qwen-style
decoder. It is frozen and hashable because a flax linen module keeps it as an
attribute and jit caches programs on it. `RopeScaling` describes how rotary
frequencies are rescaled for long contexts; the supported kinds follow
transformers' `modeling_rope_utils` (5.x): "default", "linear" and "llama3".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from dew.models.remat import check_remat

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling (transformers' `rope_parameters` / `rope_scaling`).

    rope_type: "default" (no scaling), "linear" (positions divided by `factor`)
    or "llama3" (low frequencies divided by `factor`, high frequencies kept, a
    smooth blend between `low_freq_factor` and `high_freq_factor`, measured
    against `original_max_position_embeddings`).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_scaling.rope_type: expected one of {ROPE_TYPES}, got {self.rope_type!r}"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor: expected > 0, got {self.factor}")

    @classmethod
    def from_mapping(cls, scaling: Mapping[str, Any] | RopeScaling | None) -> RopeScaling:
        """Read a transformers rope dict (`rope_type` or the older `type` key)."""
        if scaling is None:
            return cls()
        if isinstance(scaling, RopeScaling):
            return scaling
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        return cls(
            rope_type=str(kind),
            factor=float(scaling.get("factor", 1.0)),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                scaling.get("original_max_position_embeddings", 8192)
            ),
        )

    def to_mapping(self) -> dict[str, Any]:
        """The transformers form of this scaling (without `rope_theta`)."""
        if self.rope_type == "default":
            return {"rope_type": "default"}
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return {
            "rope_type": "llama3",
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shapes and numerics of a pre-norm decoder (Llama, Qwen2, Qwen3 shapes).

    vocab_size: V. emb_features: model width D. num_layers: L.
    num_heads: query heads H. num_kv_heads: key/value heads (grouped-query
    attention; H must be a multiple). head_dim: per-head width (defaults to
    D // H). mlp_features: SwiGLU hidden width. max_seq_len: longest sequence
    (or cache capacity) the model accepts. rope_theta, rope_scaling: rotary
    base and scaling. norm_eps: RMSNorm epsilon. qk_norm: Qwen3's per-head
    RMSNorm on queries and keys before the rotation. attention_bias: biases on
    the q/k/v projections (Qwen2). tie_embeddings: the output head reuses the
    token embedding. logit_softcap: if set, logits become cap * tanh(x / cap).
    sliding_window: None for full causal attention, or W >= 1: the query at
    index i sees only the keys at indices i-W+1 .. i (its own and the W-1 before
    it, inside its segment), in training, prefill and cached decoding alike;
    W = 1 lets a token see only itself, W >= T equals full attention.
    dtype: compute dtype name ("float32" or "bfloat16"); parameters stay float32.
    init_std: standard deviation of the normal initializer.
    remat: gradient checkpointing of each decoder layer (`dew.models.remat`): "none",
    "full", "dots_saveable" or "dots_with_no_batch_dims_saveable"; it changes memory and
    time only, never the parameters or what a checkpoint holds (config.json leaves it out).
    scan_layers: run the layers of the whole-sequence forward pass as one `jax.lax.scan`
    over their stacked parameters (`dew.models.scan`), so one layer body is compiled
    instead of L; the parameter tree, the outputs (to float32 rounding) and config.json
    stay the same. Decoding keeps the loop.
    """

    vocab_size: int
    emb_features: int
    num_layers: int
    num_heads: int
    mlp_features: int
    max_seq_len: int = 2048
    num_kv_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    norm_eps: float = 1e-6
    qk_norm: bool = False
    attention_bias: bool = False
    tie_embeddings: bool = True
    logit_softcap: float | None = None
    sliding_window: int | None = None
    dtype: str = "float32"
    init_std: float = 0.02
    remat: str = "none"
    scan_layers: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "emb_features", "num_layers", "num_heads", "mlp_features"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if not isinstance(self.rope_scaling, RopeScaling):
            object.__setattr__(self, "rope_scaling", RopeScaling.from_mapping(self.rope_scaling))
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            if self.emb_features % self.num_heads:
                raise ValueError(
                    f"head_dim: emb_features={self.emb_features} is not divisible by "
                    f"num_heads={self.num_heads}; pass head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.emb_features // self.num_heads)
        assert self.num_kv_heads is not None and self.head_dim is not None
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: expected a positive divisor of num_heads={self.num_heads}, "
                f"got {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim: rotary embedding needs an even width, got {self.head_dim}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {tuple(_DTYPES)}, got {self.dtype!r}")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise ValueError(f"logit_softcap: expected > 0 or None, got {self.logit_softcap}")
        window = self.sliding_window
        if window is not None and (
            not isinstance(window, int) or isinstance(window, bool) or window <= 0
        ):
            raise ValueError(f"sliding_window: expected a positive int or None, got {window!r}")
        check_remat(self.remat)
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"scan_layers: expected a bool, got {self.scan_layers!r}")

    @property
    def compute_dtype(self) -> Any:
        """The jnp dtype activations are computed in."""
        return _DTYPES[self.dtype]

    @property
    def kv_heads(self) -> int:
        assert self.num_kv_heads is not None
        return self.num_kv_heads

    @property
    def width_per_head(self) -> int:
        assert self.head_dim is not None
        return self.head_dim

    def replace(self, **changes: Any) -> DecoderConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype given as a name or a numpy/jax dtype to a config name."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = jnp.dtype(dtype).name
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected one of {tuple(_DTYPES)}, got {dtype!r}")
    return name

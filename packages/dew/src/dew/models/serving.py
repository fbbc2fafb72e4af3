"""A faster parameter layout for inference, derived from the training layout.

`fuse(variables, config)` returns a copy of a `CausalTransformer`'s variables
where each layer's `mlp/gate_proj` and `mlp/up_proj` kernels become one
`mlp/gate_up_kernel` `[D, 2F]` (one matmul instead of two) and the output head
gets a `head_kernel` `[D, V]` (the tied embedding transposed once, or the
untied head's kernel), so decoding never transposes the embedding. The module
reads these when present and computes the same function; training code never
sees them. `Server` serves this layout and rebuilds it on every reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from dew.models.config import DecoderConfig


def fuse(variables: Mapping[str, Any], config: DecoderConfig) -> dict[str, Any]:
    """The serving layout of `variables` (a `{"params": ...}` mapping); arrays are not
    copied except the fused kernels."""
    params = dict(variables["params"])
    for i in range(config.num_layers):
        name = f"layers_{i}"
        layer = dict(params[name])
        mlp = dict(layer["mlp"])
        if "gate_up_kernel" not in mlp:
            gate = mlp.pop("gate_proj")["kernel"]
            up = mlp.pop("up_proj")["kernel"]
            mlp["gate_up_kernel"] = jnp.concatenate([gate, up], axis=1)
        layer["mlp"] = mlp
        params[name] = layer
    if "head_kernel" not in params:
        if config.tie_embeddings:
            params["head_kernel"] = jnp.asarray(params["embed_tokens"]["embedding"]).T
        else:
            params["head_kernel"] = params.pop("lm_head")["kernel"]
    return {**variables, "params": params}

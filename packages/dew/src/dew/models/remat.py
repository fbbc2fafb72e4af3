"""Gradient checkpointing of the decoder layers: which activations a layer keeps.

`DecoderConfig.remat` names a policy; `remat_layer(DecoderLayer, name)` returns the layer
class to build (the class itself for "none", else it wrapped with flax's `nn.remat`, the
lifted `jax.checkpoint`). Under differentiation a wrapped layer keeps only what its policy
saves and recomputes the rest in the backward pass, trading compute for memory; its
parameters, their names and its outputs are those of the plain layer, so checkpoints load
either way. Without differentiation (scoring, prefill) nothing is recomputed.

Policies (`REMAT_POLICIES`):

* "none": keep every activation the backward pass reads (no recomputation);
* "full": keep only each layer's inputs and recompute the whole layer (JAX's
  `checkpoint_policies.nothing_saveable`);
* "dots_saveable": keep the outputs of matrix products, recompute the cheap elementwise
  work (norms, rotary, SwiGLU's activation, softmax);
* "dots_with_no_batch_dims_saveable": keep only the products without batch dimensions
  (the projections), recompute the attention scores too.

Only `__call__` is wrapped; cached decoding (`decode`) runs the plain method. `causal` and
`block_size`, the layer's fifth and sixth arguments, are static.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
#: The layer call's static arguments, counting the module as 0: (x, cos, sin, mask) are
#: arrays, causal (5) and block_size (6) choose the program.
_STATIC = (5, 6)


def check_remat(name: Any) -> str:
    """`name` when it is one of `REMAT_POLICIES`; else a one-line error naming `remat`."""
    if not isinstance(name, str) or name not in REMAT_POLICIES:
        raise ValueError(f"remat: expected one of {', '.join(REMAT_POLICIES)}, got {name!r}")
    return name


def remat_policy(name: str) -> Any:
    """The `jax.checkpoint` policy of a policy name (None for "full": save nothing)."""
    check_remat(name)
    if name in ("none", "full"):
        return None
    return getattr(jax.checkpoint_policies, name)


def remat_layer(layer: type[nn.Module], name: str) -> Any:
    """`layer` itself for "none", else `layer` with `__call__` under `nn.remat` and the
    policy of `name`."""
    if check_remat(name) == "none":
        return layer
    return nn.remat(layer, static_argnums=_STATIC, policy=remat_policy(name))


__all__ = ["REMAT_POLICIES", "check_remat", "remat_layer", "remat_policy"]

"""Running the decoder layers as one `jax.lax.scan` instead of L unrolled copies.

`DecoderConfig.scan_layers` turns this on for the whole-sequence forward pass
(`CausalTransformer.__call__`, `hidden_states`, `prefill`). The parameter tree does not
change: each layer keeps its own `layers_i` subtree, and `scan_layers` stacks those L
subtrees along a new leading axis at the moment of the call, so XLA compiles one layer
body and loops over it L times. Gradients flow back through the stack into each
`layers_i` as before. The cost is one copy of the layer parameters per forward pass (the
stack) and its transpose in the backward pass.

The body is a detached `DecoderLayer` applied to one slice of the stack. With
`config.remat` other than "none" the body runs under `jax.checkpoint` with the policy of
`dew.models.remat`, which is what `remat_layer` gives the unrolled loop.

Every layer must hold the same parameter structure and shapes (true of the training
layout and of the serving layout of `dew.models.serving.fuse`, which fuses every layer
alike); a mismatch fails with a one-line error naming the layer. Decoding (`decode`,
`extend`) and the LoRA interceptor (`dew.models.lora.apply`, which wraps projections by
their `layers_i` path) keep the loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dew.models.config import DecoderConfig
from dew.models.layers import DecoderLayer
from dew.models.remat import remat_policy
from dew.models.two_copy import TwoCopy


def stack_layers(layers: Sequence[Mapping[str, Any]]) -> Any:
    """L per-layer parameter trees -> one tree whose leaves are `[L, ...]`.

    Every tree must have the structure and leaf shapes of the first; else a one-line
    error naming the first layer that differs.
    """
    if not layers:
        raise ValueError("layers: expected at least one layer's parameters, got none")
    first = str(jax.tree.structure(layers[0]))
    shapes = [jnp.shape(leaf) for leaf in jax.tree.leaves(layers[0])]
    for i, tree in enumerate(layers[1:], start=1):
        got = [jnp.shape(leaf) for leaf in jax.tree.leaves(tree)]
        if str(jax.tree.structure(tree)) != first or got != shapes:
            raise ValueError(
                f"layers_{i}: expected the parameter structure and shapes of layers_0 to "
                f"scan the layers, got a different tree"
            )
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *layers)


def scan_layers(
    config: DecoderConfig,
    layers: Sequence[Mapping[str, Any]],
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array,
    causal: bool,
    block_size: int | TwoCopy | None,
) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """Apply L decoder layers (their `params` subtrees `layers`) to x `[B, T, D]`.

    cos, sin `[B, T, Dh]` and mask bool `[B, T, T]` are shared by every layer; causal and
    block_size are static, as for `DecoderLayer.__call__`. Returns the last layer's output
    `[B, T, D]` and each layer's rotated keys and values `[B, T, KVH, Dh]`, in layer order,
    as the unrolled loop does.
    """
    stacked = stack_layers(layers)
    layer = DecoderLayer(config, parent=None)

    def body(carry: jax.Array, params: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        out, kv = layer.apply({"params": params}, carry, cos, sin, mask, causal, block_size)
        return out, kv  # type: ignore[return-value]

    if config.remat != "none":
        # prevent_cse=False: the loop already keeps XLA from merging the recomputation.
        body = jax.checkpoint(body, policy=remat_policy(config.remat), prevent_cse=False)
    x, (keys, values) = jax.lax.scan(body, x, stacked)
    return x, [(keys[i], values[i]) for i in range(len(layers))]


__all__ = ["scan_layers", "stack_layers"]

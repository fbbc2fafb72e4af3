"""The adapter tree: its initialisation, its shape check, and merging it into the base.

An adapter tree mirrors the decoder's parameter tree down to each target
projection and holds two float32 factors there instead of a kernel::

    {"layers_0": {"self_attn": {"q_proj": {"a": [in, r], "b": [r, out]}}}, ...}

so that the wrapped projection computes `x @ W + scale * (x @ a) @ b`. These are
PEFT's `lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]` transposed to the
flax `[in, out]` orientation of Dew's kernels.

`init_adapters` draws `a` as torch's `nn.Linear` default (Kaiming-uniform with
a = sqrt(5), i.e. uniform in +-1/sqrt(in)) and sets `b` to zeros, PEFT's
`init_lora_weights=True`; the product is then zero and a fresh adapter leaves
the model's outputs unchanged. `merge_adapters` returns base parameters with
`W + scale * a @ b` in each target kernel, the weights to save in the Hugging
Face layout or to serve without the extra matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.models.config import DecoderConfig
from dew.models.lora.config import LoraConfig
from dew.models.lora.targets import Target, select_targets


def flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """`{path: leaf}` over a nested mapping (a leaf is anything not a mapping)."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping):
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def nest(leaves: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """The nested dict of `{path: leaf}` (the inverse of `flatten`)."""
    tree: dict[str, Any] = {}
    for path, leaf in leaves.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def factor_shapes(target: Target, rank: int) -> dict[str, tuple[int, int]]:
    """`{"a": (in, r), "b": (r, out)}` for one target."""
    return {"a": (target.in_features, rank), "b": (rank, target.out_features)}


def init_adapters(key: jax.Array, model_config: DecoderConfig, lora: LoraConfig) -> dict[str, Any]:
    """A fresh adapter tree for the projections `lora` targets (float32, `b` zero).

    key: a JAX PRNG key; target i draws its `a` from `fold_in(key, i)` in
    checkpoint order, so adding targets later in that order keeps earlier draws.
    """
    leaves = {}
    for i, target in enumerate(select_targets(model_config, lora)):
        shapes = factor_shapes(target, lora.rank)
        bound = 1.0 / math.sqrt(target.in_features)
        a = jax.random.uniform(jax.random.fold_in(key, i), shapes["a"], jnp.float32, -bound, bound)
        leaves[(*target.path, "a")] = a
        leaves[(*target.path, "b")] = jnp.zeros(shapes["b"], jnp.float32)
    return nest(leaves)


def check_adapters(
    adapters: Mapping[str, Any], model_config: DecoderConfig, lora: LoraConfig
) -> list[Target]:
    """The targets, after checking that `adapters` holds exactly their factors.

    Raises a ValueError naming the first missing, unexpected or misshapen
    factor (an adapter made for another base shape or another rank), or a
    non-float one. Works on arrays and on `jax.ShapeDtypeStruct`s alike.
    """
    targets = select_targets(model_config, lora)
    leaves = flatten(adapters)
    expected = {}
    for target in targets:
        for factor, shape in factor_shapes(target, lora.rank).items():
            expected[(*target.path, factor)] = shape
    for path, shape in expected.items():
        if path not in leaves:
            raise ValueError(f"adapters: expected a factor at {'/'.join(path)}, got none")
        got = tuple(np.shape(leaves[path]))
        if got != shape:
            raise ValueError(
                f"adapters: {'/'.join(path)}: expected shape {shape}, got {got} "
                "(an adapter for another base shape or rank)"
            )
        dtype = jnp.result_type(leaves[path])
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"adapters: {'/'.join(path)}: expected a float dtype, got {dtype}")
    extra = sorted(set(leaves) - set(expected))
    if extra:
        raise ValueError(
            f"adapters: unexpected factor {'/'.join(extra[0])} (targets {lora.targets!r} "
            f"select {len(targets)} projections)"
        )
    return targets


def merge_adapters(
    params: Mapping[str, Any],
    adapters: Mapping[str, Any],
    model_config: DecoderConfig,
    lora: LoraConfig,
) -> dict[str, Any]:
    """Base `params` with `kernel + scale * a @ b` (float32) in every target.

    Other leaves are shared, not copied. The result is an ordinary parameter
    tree: `Pretrained(...).save` writes it in the Hugging Face layout.
    """
    targets = check_adapters(adapters, model_config, lora)
    leaves = flatten(params)
    factors = flatten(adapters)
    for target in targets:
        path = (*target.path, "kernel")
        if path not in leaves:
            raise ValueError(f"params: expected a kernel at {'/'.join(path)}, got none")
        kernel = jnp.asarray(leaves[path], jnp.float32)
        if kernel.shape != (target.in_features, target.out_features):
            raise ValueError(
                f"params: {'/'.join(path)}: expected shape "
                f"{(target.in_features, target.out_features)}, got {tuple(kernel.shape)}"
            )
        a = jnp.asarray(factors[(*target.path, "a")], jnp.float32)
        b = jnp.asarray(factors[(*target.path, "b")], jnp.float32)
        delta = jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
        leaves[path] = kernel + jnp.float32(lora.scale) * delta
    return nest(leaves)

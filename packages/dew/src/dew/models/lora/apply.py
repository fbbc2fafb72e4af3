"""Running a frozen decoder with adapters, and differentiating only the adapters.

`apply_adapters(model, variables, adapters, lora, *args, ...)` is
`model.apply(variables, *args, ...)` in which every targeted projection
computes, as PEFT's `lora.Linear.forward` does (peft 0.21),

    y = x @ W (+ bias) + scale * (dropout(x) @ a) @ b

with `x` and the factors cast to the model's compute dtype. It works for any
method of the decoder (`__call__`, `hidden_states`, `prefill`, `decode`):
a flax method interceptor adds the adapter path to each targeted `Linear`
call, so the decoder itself is unchanged and the base kernels are read as
they are. Dropout applies only with a `dropout_key` and `lora.dropout > 0`
(training); target i then draws its mask from `fold_in(dropout_key, i)`.

`adapter_value_and_grad(loss)` turns `loss(params, adapters, *args)` into a
function returning `(value, gradient with respect to adapters)`; the base
parameters pass through `stop_gradient`, so neither gradients nor optimizer
state exist for them.

The serving layout of `dew.models.serving.fuse` (fused gate/up kernels) has no
`gate_proj`/`up_proj` calls to wrap: merge the adapters first
(`merge_adapters`) and fuse the merged weights. A model with
`config.scan_layers` runs its layers in the unrolled loop here, since the
interceptor tells the targets apart by their `layers_i` path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dew.models.decoder import CausalTransformer
from dew.models.linear import Linear, matmul
from dew.models.lora.adapters import check_adapters, flatten
from dew.models.lora.config import LoraConfig


def _dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


def apply_adapters(
    model: CausalTransformer,
    variables: Mapping[str, Any],
    adapters: Mapping[str, Any],
    lora: LoraConfig,
    *args: Any,
    dropout_key: jax.Array | None = None,
    **kwargs: Any,
) -> Any:
    """`model.apply(variables, *args, **kwargs)` with `adapters` on the targets.

    `kwargs` go to `model.apply` unchanged (`method=`, `causal=False`,
    `block_size=`, `two_copy=True`, ...), so every attention mode of the
    decoder runs with the adapter. The
    adapter tree is checked against `model.config` and `lora` first
    (`check_adapters`), so an adapter for another base shape fails with a
    message naming the factor.
    """
    params = variables.get("params", {})
    if "head_kernel" in params:
        raise ValueError(
            "variables: expected the training layout, got the serving layout of "
            "dew.models.serving.fuse; merge the adapters (merge_adapters) before fusing"
        )
    targets = check_adapters(adapters, model.config, lora)
    factors = flatten(adapters)
    index = {target.path: i for i, target in enumerate(targets)}
    use_dropout = dropout_key is not None and lora.dropout > 0.0

    def interceptor(next_fun: Callable, call_args: tuple, call_kwargs: dict, context: Any) -> Any:
        module = context.module
        out = next_fun(*call_args, **call_kwargs)
        if context.method_name != "__call__" or not isinstance(module, Linear):
            return out
        path = tuple(module.path)
        if path not in index:
            return out
        dtype = module.dtype
        x = call_args[0].astype(dtype)
        if use_dropout:
            assert dropout_key is not None
            x = _dropout(x, lora.dropout, jax.random.fold_in(dropout_key, index[path]))
        a = factors[(*path, "a")].astype(dtype)
        b = factors[(*path, "b")].astype(dtype)
        delta = matmul(matmul(x, a), b) * jnp.asarray(lora.scale, dtype)
        return out + delta.astype(out.dtype)

    if model.config.scan_layers:  # the interceptor finds targets by their layers_i path
        model = model.clone(config=model.config.replace(scan_layers=False))
    with nn.intercept_methods(interceptor):
        return model.apply(variables, *args, **kwargs)


def adapter_value_and_grad(loss: Callable[..., Any], *, has_aux: bool = False) -> Callable:
    """`loss(params, adapters, *args, **kwargs)` -> `(value, d value / d adapters)`.

    The returned function takes the same arguments. `params` (the frozen base,
    any pytree) enters `loss` through `jax.lax.stop_gradient`; only `adapters`
    is differentiated. With `has_aux`, `loss` returns `(value, aux)` and the
    result is `((value, aux), grads)`, as with `jax.value_and_grad`.
    """

    def frozen_base(params: Any, adapters: Any, *args: Any, **kwargs: Any) -> Any:
        return loss(jax.lax.stop_gradient(params), adapters, *args, **kwargs)

    return jax.value_and_grad(frozen_base, argnums=1, has_aux=has_aux)

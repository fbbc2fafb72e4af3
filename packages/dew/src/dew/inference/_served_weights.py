"""Weights as the continuous-batching ``Server`` serves them: cast and fused.

``served_variables`` turns a decoder's variables mapping into the tree the server's compiled
programs read: every floating leaf cast to the served compute dtype (integer leaves kept),
then the fused serving layout of ``dew.models.serving``. The server calls it at construction
and on every ``reload``, and compares the result's signature with the one it serves.

A ``LoraDecoder``'s variables (``{"params": adapter, "base": base params}``) are cast but not
fused: the adapter adds to the ``gate_proj``/``up_proj`` calls that fusing would remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.models.config import DecoderConfig
from dew.models.lora import BASE, LoraConfig, check_adapters
from dew.models.serving import fuse


def served_variables(
    variables: Mapping[str, Any], dtype: Any, config: DecoderConfig, lora: LoraConfig | None = None
) -> Mapping[str, Any]:
    """``variables`` with floating leaves cast to ``dtype``, in ``config``'s fused layout
    (with ``lora``: an adapter in ``params`` beside the base in ``base``, cast, not fused).

    Raises ``ValueError`` when there is no ``params`` collection, or when the tree is not
    this model's parameters (a missing or misshapen leaf; with ``lora``: no ``base``
    collection, or an adapter of other shapes), naming the problem.
    """

    def cast(x: Any) -> Any:
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    if "params" not in variables:
        raise ValueError("variables: expected a mapping with a 'params' collection")
    if lora is not None:
        if BASE not in variables:
            raise ValueError(
                f"variables: expected a {BASE!r} collection with the base parameters beside "
                f"the adapter in 'params', got collections {sorted(variables)}"
            )
        check_adapters(variables["params"], config, lora)
        return jax.tree.map(cast, dict(variables))
    try:
        return fuse(jax.tree.map(cast, dict(variables)), config)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"variables: not a tree of this model's parameters ({error!r})") from error


__all__ = ["served_variables"]

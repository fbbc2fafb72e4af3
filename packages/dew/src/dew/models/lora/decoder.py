"""A decoder whose variables are an adapter tree beside a frozen base.

`LoraDecoder(config, lora)` is a `CausalTransformer` (so everything that takes
one, `dew.inference.TextGeneration` included, takes it) whose `apply` reads
variables laid out for adapter training:

    {"params": adapter tree, "base": the base's params, ...}

The adapter sits in `params`, the collection the Trainer differentiates and
hands to the optimizer; the base rides in `base`, which nothing updates and
no gradient reaches. Without `params` (`{"base": ...}`) the adapter is off and
the call is the base model's own forward pass: that is the frozen reference of
DPO and GRPO, read from the weights already held instead of a second copy.

A `lora_dropout` entry holding a PRNG key turns on the adapter's dropout for
that call (`apply_adapters`' `dropout_key`); `dew.objectives.lora` adds it to
the policy's forward while training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from dew.models.decoder import CausalTransformer
from dew.models.lora.apply import apply_adapters
from dew.models.lora.config import LoraConfig

#: The collection that holds the frozen base parameters.
BASE = "base"
#: The entry that carries the adapter dropout key of one call.
DROPOUT = "lora_dropout"


class LoraDecoder(CausalTransformer):
    """A `CausalTransformer` run with the adapter in `params` and the base in `base`.

    config: the base's `DecoderConfig`. lora: the adapter's `LoraConfig`.
    """

    lora: LoraConfig | None = None

    @nn.nowrap
    def base_model(self) -> CausalTransformer:
        """The plain decoder of the same config (the base without adapters)."""
        return CausalTransformer(self.config)

    @nn.nowrap
    def apply(self, variables: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """The forward pass (any method, through `method=`) with the adapter, or without
        it when `variables` has no `params`."""
        if self.lora is None:
            raise ValueError("lora: expected a LoraConfig, got None")
        if BASE not in variables:
            raise ValueError(
                f"variables: expected a {BASE!r} collection with the frozen base parameters, "
                f"got collections {sorted(variables)}"
            )
        rest = {k: v for k, v in variables.items() if k not in ("params", BASE, DROPOUT)}
        base_variables = {**rest, "params": variables[BASE]}
        if "params" not in variables:
            return self.base_model().apply(base_variables, *args, **kwargs)
        return apply_adapters(
            self.base_model(),
            base_variables,
            variables["params"],
            self.lora,
            *args,
            dropout_key=variables.get(DROPOUT),
            **kwargs,
        )


__all__ = ["BASE", "DROPOUT", "LoraDecoder"]

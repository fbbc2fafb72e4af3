"""Serving a base decoder with a LoRA adapter, applied on the fly or folded in.

`with_adapter(model, variables, adapters, lora, merge=...)` returns a `(model, variables)`
pair that `TextGeneration` and `Server` (and through the server dew-rollout's
`NativeRolloutServer`) take as they take any decoder:

* unmerged (`merge=False`): a `dew.models.lora.LoraDecoder` with variables
  `{"params": adapters, "base": the base's params, ...}`. Every forward pass adds
  `scale * (x @ a) @ b` to each targeted projection; the base weights stay as loaded, so a
  server can swap adapters with `Server.reload({"params": new, "base": base})`. It costs two
  thin matmuls per target and step, and `Server` keeps the training layout (no fused
  gate/up kernel, which the adapter could not reach).
* merged (`merge=True`): the plain decoder with `kernel + scale * a @ b` in every target
  (`merge_adapters`, float32), so a step costs what the base's costs and `Server` fuses as
  usual. The targeted kernels come back float32 whatever the base's parameter dtype.

Both compute the same function up to rounding (in float32 the log-probs agree to about
1e-6). `adapters` and `lora` are what `dew.models.lora.load_peft_adapter` returns for a
PEFT adapter directory, or what `LoraObjective` trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.models.decoder import CausalTransformer
from dew.models.lora import BASE, LoraConfig, LoraDecoder, check_adapters, merge_adapters


def with_adapter(
    model: CausalTransformer,
    variables: Mapping[str, Any],
    adapters: Mapping[str, Any],
    lora: LoraConfig,
    *,
    merge: bool = False,
) -> tuple[CausalTransformer, dict[str, Any]]:
    """`(model, variables)` serving the base `model`/`variables` with `adapters` on top.

    model: the base `CausalTransformer` (not a `LoraDecoder`). variables: its variables,
    a mapping with a `params` collection in the training layout (not `fuse`d). adapters:
    the adapter tree (`a` `[in, r]`, `b` `[r, out]` per target); lora: its `LoraConfig`.
    merge: fold the adapter into the weights once (see the module docstring).

    Raises `ValueError` naming the argument when the model already carries an adapter,
    the variables have no `params`, or the adapter does not fit the base's shapes.
    """
    if isinstance(model, LoraDecoder):
        raise ValueError("model: expected the base decoder, got a LoraDecoder")
    if not isinstance(model, CausalTransformer):
        raise TypeError(f"model: expected a CausalTransformer, got {type(model).__name__}")
    if not isinstance(lora, LoraConfig):
        raise TypeError(f"lora: expected a LoraConfig, got {type(lora).__name__}")
    if not isinstance(variables, Mapping) or "params" not in variables:
        raise ValueError("variables: expected a mapping with a 'params' collection")
    params = variables["params"]
    if "head_kernel" in params:
        raise ValueError(
            "variables: expected the training layout, got the fused serving layout "
            "(dew.models.serving.fuse)"
        )
    check_adapters(adapters, model.config, lora)
    rest = {k: v for k, v in variables.items() if k != "params"}
    if merge:
        merged = merge_adapters(params, adapters, model.config, lora)
        return CausalTransformer(model.config), {**rest, "params": merged}
    return LoraDecoder(model.config, lora), {**rest, "params": dict(adapters), BASE: params}


__all__ = ["with_adapter"]

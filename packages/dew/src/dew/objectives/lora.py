"""Training a LoRA adapter on a frozen base with any token objective.

`LoraObjective(objective, lora)` wraps an `LMObjective`, `DPOObjective`,
`GRPOObjective`, `MaskedDiffusionObjective` or `BlockDiffusionObjective` (any
objective whose `model` is a `CausalTransformer` and that calls `model.apply`)
so that the Trainer trains the adapter alone::

    objective = LoraObjective(DPOObjective(model, seq_len=S, pretrained=base), lora)
    state = Trainer(objective, optax.adamw(1e-4), key=key).fit(data, steps=N)
    objective.save_adapter("out/adapter", state.params)     # PEFT's layout

What the wrapper changes:

* variables: `init` returns `{"params": adapter tree, "base": base params}`
  (`dew.models.lora.decoder`). The Trainer differentiates and optimizes
  `params` only, so neither gradients nor optimizer state exist for the base.
* the model: the wrapped objective runs on a copy of itself whose `model` is a
  `LoraDecoder` of the same config, so its forward passes (and those of a
  `SampledRollout` that samples from it) go through the adapter, keyword
  arguments included: the diffusion objectives' `causal=False`, `block_size=`
  and `two_copy=True` reach the decoder as they would without the adapter.
* the frozen reference (DPO, GRPO with `beta > 0`): the base with the adapter
  switched off, read from the `base` collection the state already holds.
  `TrainState.ema` keeps nothing (`reference_variables` returns `{}`), so the
  second copy of the weights that full training keeps is gone.
* checkpoints: `frozen_collections` tells the Trainer not to write the base;
  `frozen_identity` (the base's path and a SHA-256 of its arrays) is written
  instead, and a run resumed against another base is refused, naming both.

A moving average (`ema_decay` in (0, 1)) and objectives with a partial reference
(PPO's critic) are refused. Dropout (`lora.dropout > 0`) applies to the
policy's forward in `loss` only, keyed by the step's key.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dew.models.decoder import CausalTransformer
from dew.models.lora.adapters import check_adapters, flatten, init_adapters, merge_adapters
from dew.models.lora.config import LoraConfig
from dew.models.lora.decoder import BASE, DROPOUT, LoraDecoder
from dew.models.lora.peft_io import save_peft_adapter
from dew.models.lora.targets import select_targets


def base_digest(params: Mapping[str, Any]) -> str:
    """The SHA-256 of a parameter tree: every leaf's path, dtype, shape and bytes, in order."""
    digest = hashlib.sha256()
    for path, leaf in sorted(flatten(params).items()):
        array = np.asarray(jax.device_get(leaf))
        digest.update("/".join(path).encode())
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def check_lora_wrap(model: Any, lora: Any, adapters: Mapping[str, Any] | None) -> Any:
    """Refuse what no adapter objective can wrap, by name: a model that already carries an
    adapter or is no `CausalTransformer`, a `lora` that is no `LoraConfig`, a target or rank
    the decoder lacks (`select_targets`), starting adapters of another shape. Returns the
    model's `DecoderConfig`."""
    if isinstance(model, LoraDecoder):
        raise ValueError("objective: already trains an adapter; wrap the plain objective")
    if not isinstance(model, CausalTransformer):
        raise TypeError(
            f"objective.model: expected a CausalTransformer, got {type(model).__name__}"
        )
    if not isinstance(lora, LoraConfig):
        raise TypeError(f"lora: expected a LoraConfig, got {type(lora).__name__}")
    select_targets(model.config, lora)  # a bad target or rank fails here, by name
    if adapters is not None:
        check_adapters(adapters, model.config, lora)
    return model.config


class LoraObjective:
    """Train a LoRA adapter with `objective`'s loss while its base stays frozen.

    Args:
      objective: an `LMObjective`, `DPOObjective`, `GRPOObjective` or diffusion
        objective whose `model` is a `CausalTransformer`; its `pretrained` (or fresh)
        variables are the base.
      lora: the adapter's `LoraConfig`.
      adapters: an adapter tree to start from (e.g. `load_peft_adapter`'s); default
        a fresh one (`init_adapters`, `b = 0`, so the first forward is the base's).
      base_path: where the base came from, recorded with its hash in checkpoints and
        in the exported adapter's `base_model_name_or_path`.
    """

    frozen_collections = (BASE,)

    def __init__(
        self,
        objective: Any,
        lora: LoraConfig,
        *,
        adapters: Mapping[str, Any] | None = None,
        base_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(objective, LoraObjective):
            raise ValueError("objective: already trains an adapter; wrap the plain objective")
        config = check_lora_wrap(getattr(objective, "model", None), lora, adapters)
        decay = getattr(objective, "ema_decay", None)
        if decay not in (None, 1.0):
            raise ValueError(
                f"ema_decay: expected None or 1.0 (a frozen reference) with LoRA, got {decay!r} "
                "(a moving average of the adapter is not supported)"
            )
        if hasattr(objective, "reference_variables"):
            raise ValueError(
                f"objective: {type(objective).__name__} keeps a partial reference "
                "(reference_variables), which LoRA training does not support"
            )
        self.objective = objective
        self.lora = lora
        self.model_config = config
        self.adapters = adapters
        self.base_path = None if base_path is None else os.fspath(base_path)
        self.ema_decay = decay
        self.policy = copy.copy(objective)
        self.policy.model = LoraDecoder(config, lora)
        pretrained = getattr(objective, "pretrained", None)
        # the starting policy (adapter off); also tells the Trainer to init outside jit
        self.pretrained = None if pretrained is None else {BASE: pretrained["params"]}

    def __getattr__(self, name: str) -> Any:
        """Everything else (width, seq_len, model, packed_log_probs, key_metrics, ...)
        is the wrapped objective's, running on the `LoraDecoder`."""
        if name.startswith("__") or name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def init(self, key: jax.Array) -> dict[str, Any]:
        """`{"params": adapters, "base": the objective's params, ...other collections}`."""
        base = dict(self.objective.init(key))
        adapters = self.adapters
        if adapters is None:
            adapters = init_adapters(jax.random.fold_in(key, 1), self.model_config, self.lora)
        rest = {k: v for k, v in base.items() if k != "params"}
        return {**rest, "params": dict(adapters), BASE: base["params"]}

    @staticmethod
    def reference_variables(variables: Mapping[str, Any]) -> dict[str, Any]:
        """Nothing: the reference is the base already in `variables` (`reference_of`)."""
        del variables
        return {}

    @staticmethod
    def reference_of(variables: Mapping[str, Any]) -> dict[str, Any]:
        """The variables of the adapter-off model: every collection but `params`."""
        return {k: v for k, v in variables.items() if k not in ("params", DROPOUT)}

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: dict[str, jax.Array],
        key: jax.Array,
        reference: Any = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """The wrapped loss on the adapter model; its reference is the adapter-off base."""
        policy = dict(variables)
        if self.lora.dropout > 0.0 and key is not None:
            policy[DROPOUT] = jax.random.fold_in(key, 0x10A)
        ref = None if reference is None else self.reference_of(variables)
        return self.policy.loss(policy, batch, key, ref)

    def frozen_identity(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """What a checkpoint records of the base: its path and its `base_digest`."""
        return {"base": self.base_path, "sha256": base_digest(variables[BASE])}

    def merged(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """Plain model variables with the adapter folded into the base kernels."""
        merged = merge_adapters(variables[BASE], variables["params"], self.model_config, self.lora)
        rest = {k: v for k, v in self.reference_of(variables).items() if k != BASE}
        return {**rest, "params": merged}

    def save_adapter(self, directory: str | os.PathLike[str], variables: Mapping[str, Any]) -> Path:
        """Write the adapter of `variables` in PEFT's layout (`save_peft_adapter`)."""
        return save_peft_adapter(
            directory,
            jax.device_get(variables["params"]),
            self.model_config,
            self.lora,
            base_model=self.base_path,
        )


__all__ = ["LoraObjective", "base_digest", "check_lora_wrap"]

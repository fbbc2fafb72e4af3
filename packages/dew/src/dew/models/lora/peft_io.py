"""Adapters in PEFT's on-disk layout: `adapter_model.safetensors` plus `adapter_config.json`.

PEFT (peft 0.21) saves a LoRA adapter of a `*ForCausalLM` as tensors named
`base_model.model.<module>.lora_A.weight` `[r, in]` and `...lora_B.weight`
`[out, r]`, where `<module>` is the Hugging Face module name
(`model.layers.0.self_attn.q_proj`), and a config whose `r`, `lora_alpha`,
`lora_dropout`, `use_rslora` and `target_modules` are `LoraConfig`'s fields.
`save_peft_adapter` writes that layout (float32, each file atomically, the
config last); `load_peft_adapter` reads it back as an adapter tree and a
`LoraConfig` for a given base.

Loading refuses what Dew does not implement, naming the config field (DoRA,
LoRA biases, per-module rank or alpha patterns, modules saved whole, layer
subsets, `fan_in_fan_out`, non-LoRA PEFT types), and any tensor that is
missing, unexpected or misshapen for the base. `target_modules="all-linear"`
selects every projection but the output head, as in PEFT.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.files import write_json
from dew.models import safetensors_io
from dew.models.config import DecoderConfig
from dew.models.lora.adapters import check_adapters, factor_shapes, flatten, nest
from dew.models.lora.config import PROJECTIONS, LoraConfig
from dew.models.lora.targets import select_targets

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
PREFIX = "base_model.model."
#: adapter_config.json fields Dew cannot honour, with the value that means "not used".
_UNSUPPORTED: dict[str, Any] = {
    "use_dora": False,
    "lora_bias": False,
    "bias": "none",
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "layer_replication": None,
    "exclude_modules": None,
    "target_parameters": None,
    "trainable_token_indices": None,
    "use_qalora": False,
    "alora_invocation_tokens": None,
}


def peft_names(target_name: str) -> dict[str, str]:
    """`{"a": PEFT key of lora_A, "b": PEFT key of lora_B}` for a module name."""
    return {f: f"{PREFIX}{target_name}.lora_{f.upper()}.weight" for f in ("a", "b")}


def export_peft(
    adapters: Mapping[str, Any], model_config: DecoderConfig, lora: LoraConfig
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(PEFT key, float32 array in torch's [out, in] orientation)` per factor."""
    factors = flatten(adapters)
    for target in check_adapters(adapters, model_config, lora):
        for factor, key in peft_names(target.name).items():
            array = np.asarray(jax.device_get(factors[(*target.path, factor)]), np.float32)
            yield key, np.ascontiguousarray(array.T)


def peft_config(lora: LoraConfig, base_model: str | None = None) -> dict[str, Any]:
    """The adapter_config.json mapping PEFT reads for `lora`."""
    alpha = int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha
    targets = lora.targets if isinstance(lora.targets, str) else list(lora.targets)
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _UNSUPPORTED.items()}
    config.update(
        peft_type="LORA",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
        r=lora.rank,
        lora_alpha=alpha,
        lora_dropout=lora.dropout,
        use_rslora=lora.rslora,
        target_modules=targets,
        init_lora_weights=True,
        inference_mode=True,
    )
    return config


def save_peft_adapter(
    directory: str | os.PathLike[str],
    adapters: Mapping[str, Any],
    model_config: DecoderConfig,
    lora: LoraConfig,
    *,
    base_model: str | None = None,
) -> Path:
    """Write `adapters` to `directory` in PEFT's layout; returns the directory.

    base_model: written as `base_model_name_or_path` (PEFT's hint of which base
    to load; None leaves it unset).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = dict(export_peft(adapters, model_config, lora))
    safetensors_io.save(tensors, directory / WEIGHTS)
    write_json(directory / CONFIG, peft_config(lora, base_model), indent=2, sort_keys=True)
    return directory


def lora_config_from_peft(config: Mapping[str, Any]) -> LoraConfig:
    """A `LoraConfig` from an adapter_config.json mapping, refusing what Dew lacks."""
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{CONFIG} peft_type: expected 'LORA', got {config.get('peft_type')!r}")
    for field, unused in _UNSUPPORTED.items():
        value = config.get(field, unused)
        empty = value in (None, {}, []) and unused in (None, {})
        if value != unused and not empty:
            raise ValueError(
                f"{CONFIG} {field}: expected {json.dumps(unused)} (not supported by Dew's "
                f"LoRA), got {json.dumps(value)}"
            )
    targets = config.get("target_modules")
    if targets == "all-linear":
        targets = PROJECTIONS
    elif isinstance(targets, list):
        targets = tuple(targets)
    if not isinstance(targets, str | tuple):
        raise ValueError(
            f"{CONFIG} target_modules: expected a list of names or a pattern, got {targets!r}"
        )
    return LoraConfig(
        rank=config.get("r", 8),
        alpha=config.get("lora_alpha", 8),
        targets=targets,
        dropout=config.get("lora_dropout", 0.0),
        rslora=bool(config.get("use_rslora", False)),
    )


def load_peft_adapter(
    directory: str | os.PathLike[str], model_config: DecoderConfig
) -> tuple[dict[str, Any], LoraConfig]:
    """Read a PEFT LoRA adapter for a base of `model_config`: `(adapters, LoraConfig)`.

    The factors come back float32 in Dew's orientation (`a` `[in, r]`, `b`
    `[r, out]`). Errors name the config field or the tensor key.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{directory / CONFIG}: not found (expected a PEFT adapter)"
        ) from None
    lora = lora_config_from_peft(config)
    stored = safetensors_io.read_header(directory / WEIGHTS)[0]
    expected: dict[str, tuple[tuple[str, ...], tuple[int, int]]] = {}
    for target in select_targets(model_config, lora):
        shapes = factor_shapes(target, lora.rank)
        for factor, key in peft_names(target.name).items():
            expected[key] = ((*target.path, factor), shapes[factor][::-1])
    for key, (_, shape) in expected.items():
        if key not in stored:
            raise ValueError(f"{directory / WEIGHTS}: expected tensor {key!r}, got none")
        if tuple(stored[key]["shape"]) != shape:
            raise ValueError(
                f"{directory / WEIGHTS}: tensor {key!r}: expected shape {shape}, got "
                f"{tuple(stored[key]['shape'])} (an adapter for another base shape or rank)"
            )
    extra = sorted(set(stored) - set(expected))
    if extra:
        raise ValueError(
            f"{directory / WEIGHTS}: unexpected tensor {extra[0]!r} (target_modules "
            f"{lora.targets!r} select {len(expected) // 2} projections)"
        )
    arrays = safetensors_io.load(directory / WEIGHTS, list(expected))
    leaves = {
        path: jnp.asarray(arrays[key].astype(np.float32).T) for key, (path, _) in expected.items()
    }
    return nest(leaves), lora

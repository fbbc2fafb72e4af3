"""`build(name, **config)`: named decoder families over one `CausalTransformer`.

Each family is a set of defaults for `DecoderConfig`; keyword arguments override
them. `register(name, defaults)` adds a family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.models.config import DecoderConfig, dtype_name
from dew.models.decoder import CausalTransformer

_FAMILIES: dict[str, dict[str, Any]] = {
    "causal_transformer": {},
    "llama": {"norm_eps": 1e-5, "tie_embeddings": False, "rope_theta": 500000.0},
    "mistral": {"norm_eps": 1e-5, "tie_embeddings": False, "rope_theta": 1000000.0},
    "qwen2": {"norm_eps": 1e-6, "attention_bias": True, "rope_theta": 1000000.0},
    "qwen3": {"norm_eps": 1e-6, "qk_norm": True, "rope_theta": 1000000.0},
}


def families() -> tuple[str, ...]:
    """Names `build` accepts."""
    return tuple(sorted(_FAMILIES))


def register(name: str, defaults: Mapping[str, Any]) -> None:
    """Add (or replace) a family: `DecoderConfig` defaults under `name`."""
    unknown = set(defaults) - set(DecoderConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"defaults: unknown DecoderConfig fields {sorted(unknown)}")
    _FAMILIES[name] = dict(defaults)


def make_config(name: str, **config: Any) -> DecoderConfig:
    """The `DecoderConfig` that `build(name, **config)` would use."""
    if name not in _FAMILIES:
        raise ValueError(f"name: unknown model family {name!r}; expected one of {families()}")
    fields = DecoderConfig.__dataclass_fields__
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise TypeError(
            f"build({name!r}): unknown config fields {unknown}; expected some of {sorted(fields)}"
        )
    merged = {**_FAMILIES[name], **config}
    if "dtype" in merged:
        merged["dtype"] = dtype_name(merged["dtype"])
    return DecoderConfig(**merged)


def build(name: str, **config: Any) -> CausalTransformer:
    """A `CausalTransformer` of family `name` ("causal_transformer", "llama", "mistral",
    "qwen2", "qwen3" or a registered one). Pass `config=DecoderConfig(...)` to use a
    ready config, or `DecoderConfig` fields as keywords."""
    if "config" in config:
        ready = config.pop("config")
        if config:
            raise TypeError("build: pass either config= or config fields, not both")
        if not isinstance(ready, DecoderConfig):
            raise TypeError(f"config: expected a DecoderConfig, got {type(ready).__name__}")
        return CausalTransformer(ready)
    return CausalTransformer(make_config(name, **config))

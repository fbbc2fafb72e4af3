"""Which projections of a decoder an adapter wraps, and the shapes of its two factors.

`select_targets(model_config, lora)` lists the `Target`s that `lora.targets`
selects among the `PROJECTIONS` of every layer, in checkpoint order (layer by
layer; q, k, v, o, then gate, up, down). Each target knows its Hugging Face
module name (`model.layers.0.self_attn.q_proj`), its path in Dew's parameter
tree (`("layers_0", "self_attn", "q_proj")`) and its widths: the kernel is
`[in_features, out_features]`, so the adapter's `a` is `[in, r]` and `b` is
`[r, out]`.

Errors, each naming the field: a target entry that selects no projection (the
output head and embeddings are never targets), a pattern that selects none,
and a rank larger than the smaller width of a selected projection (the
product `a @ b` could then not have rank r).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dew.models.config import DecoderConfig
from dew.models.hf_names import tensor_specs
from dew.models.lora.config import PROJECTIONS, LoraConfig


class Target(NamedTuple):
    """One wrapped projection: HF module name, Dew params path, kernel widths."""

    name: str
    path: tuple[str, ...]
    in_features: int
    out_features: int


def projections(model_config: DecoderConfig) -> list[Target]:
    """Every projection an adapter may wrap, in checkpoint order."""
    cfg = model_config
    heads = {"q_proj": cfg.num_heads, "k_proj": cfg.kv_heads, "v_proj": cfg.kv_heads}
    d, f, inner = cfg.emb_features, cfg.mlp_features, cfg.num_heads * cfg.width_per_head
    widths = {
        "o_proj": (inner, d),
        "gate_proj": (d, f),
        "up_proj": (d, f),
        "down_proj": (f, d),
        **{proj: (d, h * cfg.width_per_head) for proj, h in heads.items()},
    }
    out = []
    for spec in tensor_specs(model_config):
        proj = spec.path[-2] if len(spec.path) >= 2 else ""
        if proj in PROJECTIONS and spec.path[-1] == "kernel":
            name = spec.name.removesuffix(".weight")
            out.append(Target(name, spec.path[:-1], *widths[proj]))
    return out


def _matches(entry: str, name: str) -> bool:
    return name == entry or name.endswith("." + entry)


def select_targets(model_config: DecoderConfig, lora: LoraConfig) -> list[Target]:
    """The projections `lora.targets` selects, checked against `lora.rank`."""
    candidates = projections(model_config)
    if isinstance(lora.targets, str):
        try:
            pattern = re.compile(lora.targets)
        except re.error as error:
            raise ValueError(
                f"targets: expected a regular expression, got {lora.targets!r} ({error})"
            ) from None
        chosen = [t for t in candidates if pattern.fullmatch(t.name)]
        if not chosen:
            raise ValueError(
                f"targets: pattern {lora.targets!r} matches no projection; expected it to match "
                f"whole names such as {candidates[0].name!r}"
            )
    else:
        for entry in lora.targets:
            if not any(_matches(entry, t.name) for t in candidates):
                raise ValueError(
                    f"targets: {entry!r} matches no projection; expected one of {PROJECTIONS} "
                    f"or a name suffix such as {candidates[0].name!r}"
                )
        chosen = [t for t in candidates if any(_matches(e, t.name) for e in lora.targets)]
    for target in chosen:
        widest = min(target.in_features, target.out_features)
        if lora.rank > widest:
            raise ValueError(
                f"rank: expected at most {widest} for {target.name} "
                f"([{target.in_features}, {target.out_features}]), got {lora.rank}"
            )
    return chosen

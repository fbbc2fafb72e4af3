"""Mapping between Hugging Face decoder checkpoints and Dew's config and parameter tree.

Covers the `LlamaForCausalLM`, `MistralForCausalLM` (with or without its
sliding window), `Qwen2ForCausalLM` and `Qwen3ForCausalLM` layouts of
transformers 5.x. Linear
weights are stored `[out, in]` by torch and `[in, out]` by flax, so they are
transposed on the way in and out; embeddings and norm scales are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dew.models.config import DecoderConfig, RopeScaling

#: transformers' `MistralConfig.sliding_window` default, used when config.json omits it.
MISTRAL_DEFAULT_WINDOW = 4096
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_FAMILY_ARCH = {family: arch for arch, family in ARCHITECTURES.items()}
_FAMILY_ARCH["causal_transformer"] = "LlamaForCausalLM"


class TensorSpec(NamedTuple):
    """One checkpoint tensor: its HF name, its path in `params`, and whether to transpose."""

    name: str
    path: tuple[str, ...]
    transpose: bool


def architecture_of(hf: Mapping[str, Any]) -> str:
    """The supported architecture named by a config.json (`architectures` or `model_type`)."""
    names = list(hf.get("architectures") or [])
    for name in names:
        if name in ARCHITECTURES:
            return name
    model_type = hf.get("model_type")
    for arch, family in ARCHITECTURES.items():
        if not names and model_type == family:
            return arch
    raise ValueError(
        f"config.json architectures: expected one of {sorted(ARCHITECTURES)}, got "
        f"{names or None} (model_type={model_type!r})"
    )


def _rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"]), RopeScaling.from_mapping(params)
    theta = float(hf.get("rope_theta", 10000.0))
    return theta, RopeScaling.from_mapping(hf.get("rope_scaling"))


def decoder_config(hf: Mapping[str, Any], dtype: str = "float32") -> tuple[str, DecoderConfig]:
    """(family, DecoderConfig) for a Hugging Face config.json mapping.

    Refuses features Dew's decoder does not implement (other activations,
    o_proj or MLP biases, a Qwen2 sliding window, which covers only some layers)
    with an error naming the field. A Mistral `sliding_window` becomes
    `DecoderConfig.sliding_window` as transformers reads it: 4096 when the key is
    absent, null for full attention, `use_sliding_window` ignored.
    """
    arch = architecture_of(hf)
    family = ARCHITECTURES[arch]
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act: expected 'silu', got {act!r}")
    if hf.get("mlp_bias"):
        raise ValueError("config.json mlp_bias: MLP biases are not supported (got true)")
    if family != "qwen2" and hf.get("attention_bias"):
        raise ValueError(f"config.json attention_bias: not supported for {arch} (got true)")
    window = _sliding_window(hf, family, arch)
    theta, scaling = _rope(hf)
    config = DecoderConfig(
        vocab_size=int(hf["vocab_size"]),
        emb_features=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=int(hf["num_attention_heads"]),
        num_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]),
        mlp_features=int(hf["intermediate_size"]),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=family == "qwen3",
        attention_bias=family == "qwen2",
        tie_embeddings=bool(hf.get("tie_word_embeddings", family != "llama")),
        logit_softcap=hf.get("final_logit_softcapping"),
        sliding_window=window,
        dtype=dtype,
    )
    return family, config


def _sliding_window(hf: Mapping[str, Any], family: str, arch: str) -> int | None:
    if family != "mistral":
        if hf.get("sliding_window") is not None and hf.get("use_sliding_window"):
            raise ValueError(
                f"config.json use_sliding_window: sliding windows are read for "
                f"MistralForCausalLM only, got true for {arch}"
            )
        return None
    # transformers' Mistral reads only `sliding_window` (default 4096 when the key is
    # absent) and ignores `use_sliding_window`: so does Dew, or the logits would differ
    window = hf.get("sliding_window", MISTRAL_DEFAULT_WINDOW)
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(
            f"config.json sliding_window: expected a positive int or null, got {window!r}"
        )
    return window


def hf_config(config: DecoderConfig, family: str, extra: Mapping[str, Any] | None = None) -> dict:
    """A transformers 5.x config.json mapping for `config` (fields of `extra` kept)."""
    if family not in _FAMILY_ARCH:
        raise ValueError(f"family: no Hugging Face architecture for {family!r}")
    arch = _FAMILY_ARCH[family]
    if config.qk_norm != (arch == "Qwen3ForCausalLM"):
        raise ValueError(
            f"qk_norm={config.qk_norm} cannot be written as {arch}; build the model as 'qwen3'"
        )
    if config.attention_bias != (arch == "Qwen2ForCausalLM"):
        raise ValueError(f"attention_bias={config.attention_bias} cannot be written as {arch}")
    if config.logit_softcap is not None:
        raise ValueError("logit_softcap: Llama and Qwen checkpoints have no logit softcap")
    if config.sliding_window is not None and arch != "MistralForCausalLM":
        raise ValueError(
            f"sliding_window={config.sliding_window} cannot be written as {arch}; "
            "build the model as 'mistral'"
        )
    out = dict(extra or {})
    out.update(
        architectures=[arch],
        model_type=ARCHITECTURES[arch],
        vocab_size=config.vocab_size,
        hidden_size=config.emb_features,
        intermediate_size=config.mlp_features,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.width_per_head,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        hidden_act="silu",
        tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_theta": config.rope_theta, **config.rope_scaling.to_mapping()},
    )
    out.pop("rope_scaling", None)
    out.pop("rope_theta", None)
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        out.setdefault("attention_bias", False)
    if arch == "LlamaForCausalLM":
        out.setdefault("mlp_bias", False)
    if arch == "MistralForCausalLM":
        # transformers' Mistral default is a 4096 window, so null is written explicitly.
        out["sliding_window"] = config.sliding_window
        if config.sliding_window is not None:
            out.pop("use_sliding_window", None)
    return out


def tensor_specs(config: DecoderConfig) -> list[TensorSpec]:
    """Every tensor a checkpoint of `config` holds, in a stable order."""
    specs = [TensorSpec("model.embed_tokens.weight", ("embed_tokens", "embedding"), False)]
    for i in range(config.num_layers):
        hf, dew = f"model.layers.{i}", f"layers_{i}"
        specs.append(
            TensorSpec(f"{hf}.input_layernorm.weight", (dew, "input_layernorm", "scale"), False)
        )
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            specs.append(
                TensorSpec(
                    f"{hf}.self_attn.{proj}.weight", (dew, "self_attn", proj, "kernel"), True
                )
            )
            if config.attention_bias and proj != "o_proj":
                specs.append(
                    TensorSpec(
                        f"{hf}.self_attn.{proj}.bias", (dew, "self_attn", proj, "bias"), False
                    )
                )
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                specs.append(
                    TensorSpec(
                        f"{hf}.self_attn.{norm}.weight", (dew, "self_attn", norm, "scale"), False
                    )
                )
        specs.append(
            TensorSpec(
                f"{hf}.post_attention_layernorm.weight",
                (dew, "post_attention_layernorm", "scale"),
                False,
            )
        )
        for proj in ("gate_proj", "up_proj", "down_proj"):
            specs.append(TensorSpec(f"{hf}.mlp.{proj}.weight", (dew, "mlp", proj, "kernel"), True))
    specs.append(TensorSpec("model.norm.weight", ("norm", "scale"), False))
    if not config.tie_embeddings:
        specs.append(TensorSpec("lm_head.weight", ("lm_head", "kernel"), True))
    return specs

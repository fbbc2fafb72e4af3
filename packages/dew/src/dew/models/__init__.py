"""Dew's decoder models (flax linen, functional).

Contract the rest of Dew relies on::

    model = dew.models.build("causal_transformer", vocab_size=V, emb_features=D,
                             num_layers=L, num_heads=H, mlp_features=F, max_seq_len=T)
    variables = model.init(key, input_ids)            # {"params": ...}, float32
    logits = model.apply(variables, input_ids, segment_ids=None, positions=None)

* input_ids: int32 `[B, T]`. logits: float32 `[B, T, V]` whatever the compute dtype.
* segment_ids `[B, T]` (0 = padding): tokens attend only to earlier tokens of their
  own segment, so packed chains never see each other. positions `[B, T]` restart
  at 0 per chain (they drive the rotary embedding). Both None: one segment per
  row, positions 0..T-1.
* Hidden states for value heads: `model.apply(variables, ids, seg, pos,
  method="hidden_states")` -> `[B, T, D]` (final norm applied), or
  `model.apply(..., return_hidden=True)` -> `(logits, hidden)`;
  `method="logits_from_hidden"` maps hidden states to logits.
* Generation: `method="prefill"` (left-padded ids, lengths, capacity) ->
  (last logits `[B, V]`, `KVCache`) and `method="decode"` (tokens `[B]`, cache,
  active `[B]`, optional static attention window) -> (logits `[B, V]`, cache).
  Inactive rows keep their cache. `dew.models.serving.fuse` gives an
  inference-only layout (fused gate/up, pre-transposed head) that `Server` uses.
* Families: "causal_transformer", "llama", "mistral", "qwen2", "qwen3"
  (`families()`); any `DecoderConfig` field is a keyword (num_kv_heads, head_dim,
  rope_theta, rope_scaling, qk_norm, tie_embeddings, logit_softcap,
  sliding_window, dtype="float32"|"bfloat16", ...). Parameters are always float32.
  sliding_window=W (Mistral checkpoints carry one) limits each token to itself and
  the W-1 tokens before it, in the forward pass and in cached decoding alike.
* Checkpoints: `load_pretrained(directory)` reads a Hugging Face layout into a
  `Pretrained(model, variables, config)`; `Pretrained.save(directory, dtype=...)`
  writes it back; `Pretrained.export()` yields the `(hf_name, array)` pairs.
"""

from dew.models.config import DecoderConfig, RopeScaling
from dew.models.decoder import CausalTransformer, KVCache, empty_cache
from dew.models.pretrained import CheckpointError, Pretrained, load_pretrained
from dew.models.registry import build, families, make_config, register

__all__ = [
    "CausalTransformer",
    "CheckpointError",
    "DecoderConfig",
    "KVCache",
    "Pretrained",
    "RopeScaling",
    "build",
    "empty_cache",
    "families",
    "load_pretrained",
    "make_config",
    "register",
]

"""Building blocks of the decoder: RMSNorm, grouped-query attention, SwiGLU MLP.

Numerics follow transformers 5.x `modeling_llama` / `modeling_qwen3`: RMSNorm
normalises in float32 and casts back before the scale; attention scores are
scaled by `head_dim ** -0.5` and soft-maxed in float32. Parameters are float32;
activations use the config's compute dtype.

Attention runs in two modes:

* `__call__` over a whole sequence `[B, T]` with a boolean mask `[B, T, T]`
  (causal, inside one segment), returning the rotated keys and values so that a
  prefill can store them in a cache; queries go in chunks of `QUERY_CHUNK`
  positions, each against only the keys at or before its end;
* `decode` for one new token per row against a key cache `[B, KVH, Dh, S]`
  and a value cache `[B, KVH, S, Dh]`, writing the new key/value at each row's
  own slot and leaving rows that are not `active` untouched. Keys keep their
  slots last so that the scores product `q . k` reads the cache as a plain
  `[Dh, S]` matrix per head: with the slots first it contracts the cache's
  last axis, which XLA's CPU dot ran about 4x slower at decode shapes (batch
  32, 96 slots, on a 2-core Xeon).

Both modes decide which keys a query may see with `visible`, the one place
where causality and the optional sliding window (`config.sliding_window`) are
spelled out; with a window, the whole-sequence mode also skips key blocks that
lie entirely before every query of a chunk's window.

The whole-sequence mode also runs bidirectionally (`causal=False`, for masked
diffusion): the same parameters, every key of the segment visible, a sliding
window then bounding the distance on both sides. With a block size as well it is
block-causal (block diffusion): a token sees its own block and every earlier
block of its segment (`block_causal`). BD3-LM's training pass reads a noised and
a clean copy of a row side by side (`two_copy_visible`); the caller then builds
the mask, passes `causal=False` and a `dew.models.two_copy.TwoCopy` as the block
size, and each query chunk reads only the key spans it may see (`two_copy_attention`).
The causal path is unchanged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dew.models.config import DecoderConfig
from dew.models.linear import Linear
from dew.models.rope import apply_rotary
from dew.models.two_copy import TwoCopy, two_copy_attention

NEG_INF = float(jnp.finfo(jnp.float32).min)
# Queries are processed in chunks of this many positions over the causal prefix of keys.
QUERY_CHUNK = 128


def visible(
    query: jax.Array, key: jax.Array, window: int | None, *, causal: bool = True
) -> jax.Array:
    """Whether the query at index `query` may attend to the key at index `key`.

    Indices are token positions in the row (or cache slots) and broadcast
    against each other, e.g. `[T, 1]` with `[1, S]` gives `[T, S]`. Causal:
    key <= query. With a window W (a positive int) the key must also be one of
    the W most recent, query - W < key, so W = 1 keeps only the token itself
    and W >= the sequence length is plain causal attention. Bidirectional
    (`causal=False`): every key, or with a window W the keys less than W away
    on either side, |key - query| < W. Segment and padding checks are left to
    the caller.
    """
    if not causal:
        if window is None:
            return jnp.ones(jnp.broadcast_shapes(jnp.shape(query), jnp.shape(key)), bool)
        return (key > query - window) & (key < query + window)
    seen = key <= query
    if window is not None:
        seen = seen & (key > query - window)
    return seen


def block_causal(query_pos: jax.Array, key_pos: jax.Array, size: int) -> jax.Array:
    """Block-causal visibility: the key's block is the query's or an earlier one.

    Positions (inside a segment, so packed documents start a block at their first token)
    broadcast like `visible`'s indices; block `k` holds positions `k*size .. k*size+size-1`.
    `size = 1` is plain causal attention, `size >= T` plain bidirectional attention.
    """
    return key_pos // size <= query_pos // size


def two_copy_visible(
    query_idx: jax.Array,
    key_idx: jax.Array,
    query_pos: jax.Array,
    key_pos: jax.Array,
    size: int,
    half: int,
) -> jax.Array:
    """BD3-LM's attention rule over a row holding a noised copy and then a clean copy.

    Indices `< half` are the noised copy, the rest the clean copy (Arriola et al. 2025,
    `block_diff_mask` in github.com/kuleshov-group/bd3lms `models/dit.py`); blocks are
    `position // size`, so both copies use the same positions. A noised query sees its
    own noised block and the clean blocks strictly before it; a clean query sees the
    clean blocks up to and including its own; nothing sees a noised key of another block,
    and no clean query sees a noised key. Arguments broadcast like `visible`'s indices.
    Segment and padding checks are left to the caller.
    """
    q_clean, k_clean = query_idx >= half, key_idx >= half
    q_block, k_block = query_pos // size, key_pos // size
    own_noised = ~q_clean & ~k_clean & (q_block == k_block)
    clean_context = ~q_clean & k_clean & (k_block < q_block)
    clean_causal = q_clean & k_clean & (k_block <= q_block)
    return own_noised | clean_context | clean_causal


def key_span(
    start: int,
    end: int,
    length: int,
    window: int | None,
    causal: bool,
    block_size: int | None = None,
) -> tuple[int, int]:
    """The key indices `[low, high)` that queries `[start, end)` of a `length`-long row may see.

    Causal: keys up to `end`, from `start - W + 1` with a window W. Bidirectional: the
    whole row, or `[start - W + 1, end + W - 1)` clipped to it with a window; a block size
    S also stops it at `end + S - 1` (a query's block ends at most S - 1 rows after it).
    Keys outside the span are never visible (`visible`), so the attention skips them.
    """
    low = 0 if window is None else max(0, start - window + 1)
    if causal:
        return low, end
    high = length
    for reach in (window, block_size):
        if reach is not None:
            high = min(high, end + reach - 1)
    return low, high


def _dense(
    features: int, cfg: DecoderConfig, name: str | None = None, bias: bool = False
) -> Linear:
    return Linear(
        features,
        use_bias=bias,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=nn.initializers.normal(cfg.init_std),
        name=name,
    )


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis with a learned scale (init 1)."""

    eps: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return scale.astype(self.dtype) * normed.astype(self.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and optional Qwen3 q/k norm."""

    config: DecoderConfig

    def setup(self) -> None:
        cfg = self.config
        h, kv, dh = cfg.num_heads, cfg.kv_heads, cfg.width_per_head
        self.q_proj = _dense(h * dh, cfg, bias=cfg.attention_bias)
        self.k_proj = _dense(kv * dh, cfg, bias=cfg.attention_bias)
        self.v_proj = _dense(kv * dh, cfg, bias=cfg.attention_bias)
        self.o_proj = _dense(cfg.emb_features, cfg)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.norm_eps, cfg.compute_dtype)
            self.k_norm = RMSNorm(cfg.norm_eps, cfg.compute_dtype)

    def _project(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cfg = self.config
        b, t, _ = x.shape
        dh = cfg.width_per_head
        q = self.q_proj(x).reshape(b, t, cfg.num_heads, dh)
        k = self.k_proj(x).reshape(b, t, cfg.kv_heads, dh)
        v = self.v_proj(x).reshape(b, t, cfg.kv_heads, dh)
        if cfg.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def _output(self, probs: jax.Array, v: jax.Array, b: int, t: int) -> jax.Array:
        # probs [B, KVH, G, T, S], v [B, KVH, S, Dh] -> [B, T, H*Dh]
        out = jnp.einsum("bkgts,bksd->btkgd", probs.astype(v.dtype), v)
        return self.o_proj(out.reshape(b, t, -1))

    def _scores(self, q: jax.Array, k: jax.Array, slots_last: bool = False) -> jax.Array:
        # q [B, T, H, Dh], k [B, KVH, S, Dh] (or a key cache [B, KVH, Dh, S] with
        # slots_last) -> float32 [B, KVH, G, T, S]
        cfg = self.config
        b, t, _, dh = q.shape
        q = q.reshape(b, t, cfg.kv_heads, cfg.num_heads // cfg.kv_heads, dh)
        spec = "btkgd,bkds->bkgts" if slots_last else "btkgd,bksd->bkgts"
        scores = jnp.einsum(spec, q, k, preferred_element_type=jnp.float32)
        return scores * (dh**-0.5)

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        causal: bool = True,
        block_size: int | TwoCopy | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """x `[B, T, D]`, tables `[B, T, Dh]`, mask bool `[B, T, T]` (query, key).

        The mask must already hold the visibility rule (`visible`, with the same
        `causal`, and `block_causal` for a block size) and the segment boundaries;
        keys outside a chunk's span (`key_span`) are not read. causal (static):
        False reads keys after the query too, for a mask built with
        `visible(..., causal=False)`; block_size (static) bounds that reach. A
        `TwoCopy` block size (with causal=False and a `two_copy_visible` mask) runs
        BD3-LM's two-copy pass over the key spans of `dew.models.two_copy`.
        Returns the output `[B, T, D]` and the rotated keys and values
        `[B, T, KVH, Dh]`.
        """
        b, t, _ = x.shape
        window = self.config.sliding_window
        q, k, v = self._project(x, cos, sin)
        keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        if isinstance(block_size, TwoCopy):
            heads = two_copy_attention(
                self._scores, q, keys, values, mask, block_size.size, QUERY_CHUNK
            )
            return self.o_proj(heads), (k, v)
        # Causal blocks: query chunk [s, e) only needs keys [0, e), or [s - W + 1, e)
        # with a sliding window W. Skipping the rest halves the work (or more) and keeps
        # each chunk's scores in cache; the mask still decides inside the block.
        outputs = []
        for start in range(0, t, QUERY_CHUNK):
            end = min(start + QUERY_CHUNK, t)
            low, high = key_span(start, end, t, window, causal, block_size)
            scores = self._scores(q[:, start:end], keys[:, :, low:high])
            block = mask[:, None, None, start:end, low:high]
            probs = jax.nn.softmax(jnp.where(block, scores, NEG_INF), axis=-1)
            outputs.append(self._output(probs, values[:, :, low:high], b, end - start))
        out = outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=1)
        return out, (k, v)

    def decode(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        k_cache: jax.Array,
        v_cache: jax.Array,
        slot: jax.Array,
        active: jax.Array,
        window: int | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One token per row. x `[B, 1, D]`, key cache `[B, KVH, Dh, S]`, value cache
        `[B, KVH, S, Dh]`, slot `[B]` int32 (where the new key goes; also the number of
        keys before it), active bool `[B]`.

        Rows with `active` false keep their cache bit for bit. window (static): attend
        only over the first `window` slots, which must cover every active row's
        `slot`; it saves reading the unused tail of a large cache. It is unrelated to
        `config.sliding_window`, which hides the slots older than the last W keys
        (slot - W < j <= slot) while the cache keeps every slot.
        """
        cfg = self.config
        b = x.shape[0]
        rows = jnp.arange(b)
        q, k, v = self._project(x, cos, sin)
        # [rows, :, :, slot] on the key cache gathers [B, KVH, Dh], like the values'.
        old_k = k_cache[rows, :, :, slot]
        old_v = v_cache[rows, :, slot]
        k_new = jnp.where(active[:, None, None], k[:, 0].astype(k_cache.dtype), old_k)
        v_new = jnp.where(active[:, None, None], v[:, 0].astype(v_cache.dtype), old_v)
        k_cache = k_cache.at[rows, :, :, slot].set(k_new, mode="drop")
        v_cache = v_cache.at[rows, :, slot].set(v_new, mode="drop")
        keys, values = k_cache, v_cache
        if window is not None and window < v_cache.shape[2]:
            keys, values = k_cache[..., :window], v_cache[:, :, :window]
        dh = cfg.width_per_head
        groups = cfg.num_heads // cfg.kv_heads
        q = q.reshape(b, cfg.kv_heads, groups, dh)
        scores = jnp.einsum("bkgd,bkds->bkgs", q, keys, preferred_element_type=jnp.float32)
        scores = scores * (dh**-0.5)
        seen = visible(slot[:, None], jnp.arange(values.shape[2])[None, :], cfg.sliding_window)
        scores = jnp.where(seen[:, None, None, :], scores, NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
        out = jnp.einsum("bkgs,bksd->bkgd", probs, values)
        return self.o_proj(out.reshape(b, 1, -1)), k_cache, v_cache


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)).

    A serving layout (`dew.models.serving.fuse`) may replace `gate_proj` and
    `up_proj` by one `gate_up_kernel` `[D, 2F]`, which is one larger matmul.
    """

    config: DecoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        if self.has_variable("params", "gate_up_kernel"):
            kernel: jax.Array = self.get_variable("params", "gate_up_kernel")
            fused = jnp.dot(x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))
            gate, up = jnp.split(fused, 2, axis=-1)
        else:
            gate = _dense(cfg.mlp_features, cfg, "gate_proj")(x)
            up = _dense(cfg.mlp_features, cfg, "up_proj")(x)
        return _dense(cfg.emb_features, cfg, "down_proj")(jax.nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    config: DecoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.input_layernorm = RMSNorm(cfg.norm_eps, cfg.compute_dtype)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.norm_eps, cfg.compute_dtype)
        self.mlp = SwiGLU(cfg)

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array,
        causal: bool = True,
        block_size: int | TwoCopy | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, causal, block_size)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv

    def decode(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        k_cache: jax.Array,
        v_cache: jax.Array,
        slot: jax.Array,
        active: jax.Array,
        window: int | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        attn, k_cache, v_cache = self.self_attn.decode(
            self.input_layernorm(x), cos, sin, k_cache, v_cache, slot, active, window
        )
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k_cache, v_cache

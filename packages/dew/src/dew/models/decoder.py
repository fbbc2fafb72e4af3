"""The causal decoder (Llama / Qwen2 / Qwen3 shapes) and its key/value cache.

`CausalTransformer(config)` is a flax linen module. Training and scoring call it
on packed rows; generation uses `prefill` then repeated `decode` through
`model.apply(variables, ..., method="prefill" | "decode")`.

Packed rows: `segment_ids` `[B, T]` names the chain each token belongs to (0 is
padding) and `positions` `[B, T]` restarts at 0 for each chain. A token attends
only to earlier-or-equal tokens of its own segment, so chains that share a row
never see each other. Padding tokens attend to nothing real and their outputs
are meaningless (finite, never NaN). With `config.sliding_window` W a token
also ignores keys more than W - 1 tokens before it (counted in row indices,
which inside one packed segment equal position differences).

`causal=False` (a keyword of `__call__` and `hidden_states`) runs the same
parameters bidirectionally, as masked diffusion needs: a token then attends to
every token of its own segment, before and after it (with a sliding window W,
to those fewer than W away on either side). Adding `block_size=S` makes it
block-causal, as block diffusion needs: positions `k*S .. k*S+S-1` of a segment
form block k, and a token sees its own block and every earlier one. Adding
`two_copy=True` as well runs BD3-LM's training pass: `input_ids` `[B, 2L]` holds a
noised copy of a row and then its clean copy (`segment_ids` and `positions` repeat
each copy's, both copies using positions 0..L-1, so `max_seq_len` bounds L, not 2L);
the attention follows `two_copy_visible` and only the noised copy's logits `[B, L, V]`
come back. The parameters are the same in every mode. Decoding stays causal; prefill is
causal unless given a `block_size`, and `extend` runs a chunk of tokens after a cache,
the chunk seen bidirectionally (block diffusion with a cache, `dew.models.chunk`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from dew.models.chunk import layer_chunk, write_chunk
from dew.models.config import DecoderConfig
from dew.models.layers import DecoderLayer, RMSNorm, block_causal, two_copy_visible, visible
from dew.models.linear import Linear
from dew.models.remat import remat_layer
from dew.models.rope import inverse_frequencies, rotary_tables
from dew.models.scan import scan_layers
from dew.models.two_copy import TwoCopy


@flax.struct.dataclass
class KVCache:
    """Per-layer keys and values plus each row's filled length.

    keys: tuple of L arrays `[B, KVH, Dh, S]` (slots last, the layout the decode
    step's scores product reads without a transpose), in the compute dtype.
    values: tuple of L arrays `[B, KVH, S, Dh]` in the compute dtype.
    lengths: int32 `[B]`, how many leading slots of each row hold real tokens.
    A row's tokens always occupy slots `0 .. lengths-1` in order, whatever
    padding its prompt had.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    lengths: jax.Array

    @property
    def capacity(self) -> int:
        return int(self.values[0].shape[2])

    @property
    def batch(self) -> int:
        return int(self.keys[0].shape[0])


def empty_cache(config: DecoderConfig, batch: int, capacity: int) -> KVCache:
    """A zero cache of `batch` rows and `capacity` slots."""
    shape = (batch, config.kv_heads, capacity, config.width_per_head)
    key_shape = (batch, config.kv_heads, config.width_per_head, capacity)
    dtype, layers = config.compute_dtype, range(config.num_layers)
    keys = tuple(jnp.zeros(key_shape, dtype) for _ in layers)
    values = tuple(jnp.zeros(shape, dtype) for _ in layers)
    return KVCache(keys, values, jnp.zeros((batch,), jnp.int32))


def _check_block(causal: bool, block_size: Any, two_copy: bool = False) -> None:
    if two_copy and block_size is None:
        raise ValueError("two_copy: BD3-LM's two-copy pass needs a block_size, got None")
    if block_size is None:
        return
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ValueError(f"block_size: expected a positive int or None, got {block_size!r}")
    if causal:
        raise ValueError("block_size: block-causal attention needs causal=False")


def _check_ids(name: str, value: Any, ndim: int) -> None:
    if value.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(value.shape)}")
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise ValueError(f"{name}: expected an integer dtype, got {value.dtype}")


class CausalTransformer(nn.Module):
    """Pre-norm decoder: embed, L x (attention, SwiGLU), RMSNorm, output head.

    Parameter tree (names chosen to map one-to-one onto Hugging Face's):
    `embed_tokens/embedding [V, D]`, `layers_i/{input_layernorm, self_attn/{q,k,v,o}_proj,
    self_attn/{q,k}_norm, post_attention_layernorm, mlp/{gate,up,down}_proj}`,
    `norm/scale`, and `lm_head/kernel [D, V]` when embeddings are not tied.
    """

    config: DecoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.embed_tokens = nn.Embed(
            cfg.vocab_size,
            cfg.emb_features,
            dtype=cfg.compute_dtype,
            param_dtype=jnp.float32,
            embedding_init=nn.initializers.normal(cfg.init_std),
        )
        layer = remat_layer(DecoderLayer, cfg.remat)  # gradient checkpointing, if any
        self.layers = [layer(cfg) for _ in range(cfg.num_layers)]
        self.norm = RMSNorm(cfg.norm_eps, cfg.compute_dtype)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(
                cfg.vocab_size,
                use_bias=False,
                dtype=cfg.compute_dtype,
                param_dtype=jnp.float32,
                kernel_init=nn.initializers.normal(cfg.init_std),
            )

    # -- helpers -----------------------------------------------------------------------

    def _tables(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        inv_freq = inverse_frequencies(cfg.width_per_head, cfg.rope_theta, cfg.rope_scaling)
        return rotary_tables(positions, inv_freq)

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Final hidden states `[..., D]` (already normed) to float32 logits `[..., V]`."""
        cfg = self.config
        if self.has_variable("params", "head_kernel"):  # serving layout: [D, V]
            kernel: jax.Array = self.get_variable("params", "head_kernel")
            logits = jnp.dot(hidden.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))
        elif cfg.tie_embeddings:
            logits = self.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        logits = logits.astype(jnp.float32)
        if cfg.logit_softcap is not None:
            cap = jnp.float32(cfg.logit_softcap)
            logits = cap * jnp.tanh(logits / cap)
        return logits

    def _forward(
        self,
        input_ids: jax.Array,
        segment_ids: jax.Array | None,
        positions: jax.Array | None,
        causal: bool = True,
        block_size: int | None = None,
        two_copy: bool = False,
    ) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
        _check_ids("input_ids", input_ids, 2)
        b, t = input_ids.shape
        if two_copy and t % 2:
            raise ValueError(f"input_ids: two_copy needs an even length [B, 2L], got {t}")
        if (t // 2 if two_copy else t) > self.config.max_seq_len:
            raise ValueError(
                f"input_ids: sequence length {t} exceeds max_seq_len={self.config.max_seq_len}"
            )
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        if positions is None:
            steps = jnp.arange(t // 2 if two_copy else t, dtype=jnp.int32)
            positions = jnp.broadcast_to(jnp.tile(steps, 2) if two_copy else steps, (b, t))
        for name, value in (("segment_ids", segment_ids), ("positions", positions)):
            _check_ids(name, value, 2)
            if value.shape != input_ids.shape:
                raise ValueError(
                    f"{name}: expected shape {tuple(input_ids.shape)} like input_ids, "
                    f"got {tuple(value.shape)}"
                )
        mask = self._mask(segment_ids, positions, causal, block_size, two_copy)
        cos, sin = self._tables(positions)
        x = self.embed_tokens(input_ids.astype(jnp.int32))
        kvs: list[tuple[jax.Array, jax.Array]] = []
        # The two-copy pass reads, per query chunk, only the key spans of `two_copy`.
        span_block = TwoCopy(block_size) if two_copy and block_size is not None else block_size
        if self.config.scan_layers and not self.is_initializing():  # one compiled layer body
            params = self.variables["params"]
            layers = [params[f"layers_{i}"] for i in range(self.config.num_layers)]
            x, kvs = scan_layers(self.config, layers, x, cos, sin, mask, causal, span_block)
            return self.norm(x), kvs
        for layer in self.layers:
            x, kv = layer(x, cos, sin, mask, causal, span_block)
            kvs.append(kv)
        return self.norm(x), kvs

    def _mask(
        self,
        segment_ids: jax.Array,
        positions: jax.Array,
        causal: bool,
        block_size: int | None,
        two_copy: bool,
    ) -> jax.Array:
        """Bool `[B, T, T]` (query, key): same nonzero segment and the mode's visibility."""
        t = segment_ids.shape[1]
        idx = jnp.arange(t)
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = same & (segment_ids[:, None, :] != 0)
        q_pos, k_pos = positions[:, :, None], positions[:, None, :]
        if two_copy:
            if self.config.sliding_window is not None:
                raise ValueError(
                    "two_copy: BD3-LM's two-copy pass needs sliding_window=None, "
                    f"got {self.config.sliding_window}"
                )
            assert block_size is not None
            rule = two_copy_visible(idx[:, None], idx[None, :], q_pos, k_pos, block_size, t // 2)
            return mask & rule
        seen = visible(idx[:, None], idx[None, :], self.config.sliding_window, causal=causal)
        mask = mask & seen[None]
        if block_size is not None:
            mask = mask & block_causal(q_pos, k_pos, block_size)
        return mask

    # -- public methods ----------------------------------------------------------------

    def __call__(
        self,
        input_ids: jax.Array,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        return_hidden: bool = False,
        causal: bool = True,
        block_size: int | None = None,
        two_copy: bool = False,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """input_ids int `[B, T]` -> float32 logits `[B, T, V]`.

        segment_ids `[B, T]` (0 = padding) and positions `[B, T]` default to one
        segment per row with positions 0..T-1. With `return_hidden=True` returns
        `(logits, hidden)` where hidden `[B, T, D]` is the final normed state.
        causal (static): False lets each token see its whole segment (bidirectional).
        block_size (static, with causal=False): block-causal attention over positions.
        two_copy (static, with causal=False and a block_size): BD3-LM's pass over
        `[noised, clean]` rows `[B, 2L]`; positions default to 0..L-1 for each copy and
        the logits and hidden states returned are the noised copy's, `[B, L, ...]`.
        """
        _check_block(causal, block_size, two_copy)
        hidden, _ = self._forward(input_ids, segment_ids, positions, causal, block_size, two_copy)
        if two_copy:
            hidden = hidden[:, : input_ids.shape[-1] // 2]
        logits = self.logits_from_hidden(hidden)
        if return_hidden:
            return logits, hidden
        return logits

    def hidden_states(
        self,
        input_ids: jax.Array,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        causal: bool = True,
        block_size: int | None = None,
    ) -> jax.Array:
        """Final normed hidden states `[B, T, D]` in the compute dtype (for value heads)."""
        _check_block(causal, block_size)
        hidden, _ = self._forward(input_ids, segment_ids, positions, causal, block_size)
        return hidden

    def prefill(
        self,
        input_ids: jax.Array,
        lengths: jax.Array,
        capacity: int,
        *,
        block_size: int | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Fill a fresh cache from a left-padded batch.

        input_ids `[B, P]`: row b holds its `lengths[b]` real tokens at the END
        (left padding). capacity: slots of the returned cache (>= P, static).
        Each row's real tokens are packed into slots 0..lengths-1 of its cache,
        so rows with different prompt lengths share one compiled shape.
        Returns float32 logits `[B, V]` at each row's last real token and the cache.
        A row with length 0 returns meaningless logits and an empty cache row.
        block_size (static): read the prompt block-causally in blocks of that many
        positions (`causal=False, block_size=...`) instead of causally, as a block
        diffusion model reads it before `extend` adds blocks after it.
        """
        _check_block(block_size is None, block_size)
        _check_ids("input_ids", input_ids, 2)
        b, p = input_ids.shape
        if capacity < p:
            raise ValueError(f"capacity: expected >= prompt width {p}, got {capacity}")
        lengths = lengths.astype(jnp.int32)
        idx = jnp.arange(p, dtype=jnp.int32)[None, :]
        # Move each row's real tokens to the front (cheap: ids only), so that the
        # forward pass computes keys and values already in their cache slots.
        source = jnp.minimum(idx + (p - lengths)[:, None], p - 1)
        packed_ids = jnp.take_along_axis(input_ids, source, axis=1)
        real = idx < lengths[:, None]
        segments, positions = real.astype(jnp.int32), jnp.where(real, idx, 0)
        causal = block_size is None
        hidden, kvs = self._forward(packed_ids, segments, positions, causal, block_size)
        last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)
        logits = self.logits_from_hidden(last[:, 0])
        keep = real[:, :, None, None]
        dtype = self.config.compute_dtype
        keys: list[jax.Array] = []
        values: list[jax.Array] = []
        # [B, P, KVH, Dh] -> keys [B, KVH, Dh, S], values [B, KVH, S, Dh]
        for k, v in kvs:
            for arr, out, order in ((k, keys, (0, 2, 3, 1)), (v, values, (0, 2, 1, 3))):
                arr = jnp.where(keep, arr, jnp.zeros_like(arr)).astype(dtype)
                arr = jnp.pad(arr, ((0, 0), (0, capacity - p), (0, 0), (0, 0)))
                out.append(arr.transpose(order))
        return logits, KVCache(tuple(keys), tuple(values), lengths)

    def decode(
        self,
        tokens: jax.Array,
        cache: KVCache,
        active: jax.Array | None = None,
        window: int | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Feed one token per row. tokens int `[B]`, active bool `[B]` (default all).

        Active rows write the token's key/value at slot `lengths[b]`, read at
        rotary position `lengths[b]`, and grow by one; inactive rows leave
        their cache and length untouched. Returns float32 logits `[B, V]`.
        Writing past the capacity is dropped, so callers keep
        `lengths < capacity` for active rows. window (static int): attend over the
        first `window` slots only; callers keep `lengths < window` for active rows.
        """
        _check_ids("tokens", tokens, 1)
        b = tokens.shape[0]
        if active is None:
            active = jnp.ones((b,), bool)
        slot = cache.lengths
        cos, sin = self._tables(slot[:, None])
        x = self.embed_tokens(tokens.astype(jnp.int32)[:, None])
        keys, values = [], []
        for layer, k_cache, v_cache in zip(self.layers, cache.keys, cache.values):
            x, k_cache, v_cache = layer.decode(x, cos, sin, k_cache, v_cache, slot, active, window)
            keys.append(k_cache)
            values.append(v_cache)
        logits = self.logits_from_hidden(self.norm(x)[:, 0])
        lengths = jnp.where(active, slot + 1, slot)
        return logits, KVCache(tuple(keys), tuple(values), lengths)

    def extend(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Run a chunk of C tokens per row after the cache, seen bidirectionally.

        tokens int `[B, C]` go at slots (and rotary positions) `lengths[b] + 0 .. C-1`;
        each attends to the row's cached slots `< lengths[b]` and to all C tokens of the
        chunk (`dew.models.chunk`), which is block-causal attention with the chunk as the
        last block. Returns float32 logits `[B, C, V]` and the cache with the chunk's keys
        and values written and `lengths + C`; a caller that only wants the logits (a
        denoising step) drops the cache and nothing is written. Writes past the capacity
        are dropped, so callers keep `lengths + C <= capacity`.
        """
        _check_ids("tokens", tokens, 2)
        c = tokens.shape[1]
        slots = cache.lengths[:, None] + jnp.arange(c, dtype=jnp.int32)[None, :]
        cos, sin = self._tables(slots)
        x = self.embed_tokens(tokens.astype(jnp.int32))
        keys, values = [], []
        for layer, k_cache, v_cache in zip(self.layers, cache.keys, cache.values):
            x, (k, v) = layer_chunk(layer, x, cos, sin, k_cache, v_cache, cache.lengths)
            keys.append(write_chunk(k_cache, k, cache.lengths, slot_axis=3))
            values.append(write_chunk(v_cache, v, cache.lengths))
        logits = self.logits_from_hidden(self.norm(x))
        return logits, KVCache(tuple(keys), tuple(values), cache.lengths + c)

"""The canvas loop for block-causal canvases with a key/value cache of finished blocks.

A block-causal model (`Canvas.block_causal`) lets block `k` see only the blocks before it
and itself, so the keys and values of the prompt and of every finished block never change
once written. `fill_cached` keeps them in a cache: the caller fills it with the prompt
(a block-causal prefill), each denoising step runs the model over the current block only
(`chunk_fn`, the decoder's `extend` with its cache dropped) and the block's last iteration
runs its final tokens once more to append their keys and values. Work per step is then
`L` queries against at most `P + G` keys instead of `P + G` queries.

The iteration schedule, the draws and the updates are those of `dew.inference.canvas.loop
.fill`: iteration `i` is step `i % per` of block `i // per`, it reads the same uniforms
(the block's columns of `draws(index)`), and the update runs on the block's columns alone
(its positions are the whole region, so ranks and draws are those of the whole-row
update). The logits of a step equal the uncached pass's logits on the block's columns up to
float32 summation order, so the tokens match for a key. Cached logits are reused while the
block is unchanged, as in `fill`, but never across a block boundary (they only cover the
block).

chunk_fn(block_ids [B, L], cache) -> (logits [B, L, V], cache with the block appended).
Returns `(canvas [B, W], order [B, W])` like `fill`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dew.inference.canvas.config import Canvas
from dew.inference.canvas.loop import Draws, update_at
from dew.sampling import Sampling

ChunkFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def fill_cached(
    chunk_fn: ChunkFn,
    cache: Any,
    canvas: jax.Array,
    prompt_width: int,
    config: Canvas,
    sampling: Sampling,
    draws: Draws,
) -> tuple[jax.Array, jax.Array]:
    """Fill columns `prompt_width ..` of `canvas` `[B, W]`, the prompt already in `cache`."""
    width = canvas.shape[1]
    gen = width - prompt_width
    length, blocks = config.blocks(gen)
    steps = config.steps // blocks
    per = config.iterations_per_block(gen)
    b = canvas.shape[0]
    region = jnp.ones((length,), bool)
    shape = jax.eval_shape(lambda ids: chunk_fn(ids, cache)[0], canvas[:, :length])

    def body(i, state):
        canvas, order, logits, fresh, cache = state
        block, j = i // per, i % per
        start = prompt_width + block * length
        piece = jax.lax.dynamic_slice(canvas, (0, start), (b, length))
        open_ = jnp.any(piece == config.mask_id)
        logits = jax.lax.cond(
            open_ & ~fresh, lambda x: chunk_fn(x, cache)[0], lambda _: logits, piece
        )
        uniforms = draws(block * steps + jnp.minimum(j, steps - 1))
        uniforms = jax.lax.dynamic_slice_in_dim(uniforms, start, length, axis=1)
        new = update_at(config, sampling, length, steps, j, (piece, logits, uniforms, region))
        newly = (piece == config.mask_id) & (new != config.mask_id)
        done = jax.lax.dynamic_slice(order, (0, start), (b, length))
        order = jax.lax.dynamic_update_slice(order, jnp.where(newly, i, done), (0, start))
        canvas = jax.lax.dynamic_update_slice(canvas, new, (0, start))
        last = j == per - 1
        # The block is final after its last iteration: append it (the last block need not).
        cache = jax.lax.cond(
            last & (block < blocks - 1), lambda c: chunk_fn(new, c)[1], lambda c: c, cache
        )
        return canvas, order, logits, (fresh | open_) & jnp.all(new == piece) & ~last, cache

    order = jnp.full(canvas.shape, -1, jnp.int32)
    logits = jnp.zeros(shape.shape, shape.dtype)
    state = (canvas, order, logits, jnp.bool_(False), cache)
    canvas, order, _, _, _ = jax.lax.fori_loop(0, blocks * per, body, state)
    return canvas, order

"""The canvas loop: every step of every block in one `lax.fori_loop` of one step function.

`fill(logits_fn, canvas, prompt_width, canvas_config, sampling, draws)` runs inside `jit`.
Iteration `i` works on block `i // per` (`per`: the block's steps, plus one for
ancestral `noise_removal`), step `j = i % per` inside it. The model is called only when
the canvas changed since its last call and the block still holds a masked position;
otherwise the cached logits are reused (MDLM's `_ddpm_caching_update`: without time
conditioning the model's output depends on the canvas alone, so the samples are the same).

draws(index) -> float32 `[B, W, V]`: the uniforms of step `index = block * steps_per_block
+ j` (noise removal draws none). Returns `(canvas [B, W], order [B, W])`: `order` holds the
iteration at which each position received its token (-1 for the prompt and padding, and
for a position still masked at the end, which only the ancestral sampler without noise
removal can leave).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.inference.canvas import updates
from dew.inference.canvas.config import Canvas
from dew.sampling import Sampling

LogitsFn = Callable[[jax.Array], jax.Array]
Draws = Callable[[jax.Array], jax.Array]


def _move_chance(config: Canvas, t: jax.Array) -> jax.Array:
    if config.schedule is None:
        return (1.0 - 1e-3) * t
    return jnp.asarray(config.schedule.move_chance(t), jnp.float32)


def fill(
    logits_fn: LogitsFn,
    canvas: jax.Array,
    prompt_width: int,
    config: Canvas,
    sampling: Sampling,
    draws: Draws,
) -> tuple[jax.Array, jax.Array]:
    """Fill columns `prompt_width ..` of `canvas` `[B, W]` (see the module docstring)."""
    width = canvas.shape[1]
    gen = width - prompt_width
    length, blocks = config.blocks(gen)
    steps = config.steps // blocks
    per = config.iterations_per_block(gen)
    columns = jnp.arange(width)
    shape = jax.eval_shape(logits_fn, canvas)

    def body(i, state):
        canvas, order, logits, fresh = state
        block, j = i // per, i % per
        start = prompt_width + block * length
        region = (columns >= start) & (columns < start + length)
        open_ = jnp.any((canvas == config.mask_id) & region[None, :])
        logits = jax.lax.cond(open_ & ~fresh, logits_fn, lambda _: logits, canvas)
        uniforms = draws(block * steps + jnp.minimum(j, steps - 1))
        new = update_at(config, sampling, length, steps, j, (canvas, logits, uniforms, region))
        newly = (canvas == config.mask_id) & (new != config.mask_id)
        order = jnp.where(newly, i, order)
        # The logits stay valid while the canvas they were computed on does not change.
        return new, order, logits, (fresh | open_) & jnp.all(new == canvas)

    order = jnp.full(canvas.shape, -1, jnp.int32)
    logits = jnp.zeros(shape.shape, shape.dtype)
    state = (canvas, order, logits, jnp.bool_(False))
    canvas, order, _, _ = jax.lax.fori_loop(0, blocks * per, body, state)
    return canvas, order


def update_at(
    config: Canvas, sampling: Sampling, length: int, steps: int, j: jax.Array, inputs: tuple
) -> jax.Array:
    """The canvas after step `j` (traced) of a block of `length` taking `steps` steps."""
    canvas, logits, uniforms, region = inputs
    if config.remasking == "low_confidence":
        count = updates.transfer_counts(length, steps)[jnp.minimum(j, steps - 1)]
        return updates.low_confidence(
            canvas, logits, uniforms, region, count, config.mask_id, sampling
        )
    dt = (1.0 - config.eps) / steps
    t = 1.0 - j.astype(jnp.float32) * dt
    move_t, move_s = _move_chance(config, t), _move_chance(config, t - dt)
    step = updates.ancestral(
        canvas, logits, uniforms, region, config.mask_id, move_t, move_s, sampling
    )
    if not config.noise_removal:
        return step
    removed = updates.denoise(canvas, logits, region, config.mask_id)
    return jnp.where(j == steps, removed, step)

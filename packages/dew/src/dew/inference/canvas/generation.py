"""`CanvasGeneration`: fill masked canvases with a bidirectional decoder, one compiled loop.

Prompts are left-padded to a common width `P` (padding has segment id 0 and attends to
nothing; positions count from each row's first real id), `G` mask ids follow, and
`dew.inference.canvas.loop.fill` unmasks them with the model read as
`causal=False` (and `block_size=block_length` when `block_causal`). A block-causal canvas
with `kv_cache` (the default) instead prefills the prompt block-causally into a cache of
`P + G` slots (each row's real ids packed to slots `0 ..`, so a generated block starts at
the same position as in the whole canvas) and runs `dew.inference.canvas.cached
.fill_cached`, the decoder's `extend` over one block per step. Batch sizes are bucketed
to powers of two; `compile_count` says how many programs were built.

Which `Sampling` fields apply: `temperature` (0: greedy), `top_k`, `top_p`, `min_p` and
`softcap` shape each draw (`dew.inference.canvas.updates.filtered`); `eos_id` does not stop
anything (the canvas has a fixed length) and only cuts `CanvasOutput.text_ids`;
`return_support` is refused (a canvas records no per-draw supports). Draws are
deterministic for a key: step `k` uses uniforms from `fold_in(key, k)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dew.inference.canvas.cached import fill_cached
from dew.inference.canvas.config import Canvas
from dew.inference.canvas.loop import fill
from dew.inference.compiled import CompileStats, ProgramCache, bucket
from dew.inference.generation import as_key, tree_signature, variables_of
from dew.models.decoder import CausalTransformer, empty_cache
from dew.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class CanvasOutput:
    """One filled canvas: ids int32 `[G]` (the generated positions) and order int32 `[G]`,
    the loop iteration at which each position got its token (-1: never, only possible for
    the ancestral sampler without noise removal, whose position keeps the mask id)."""

    ids: np.ndarray
    order: np.ndarray
    eos_ids: tuple[int, ...] = ()

    @property
    def text_ids(self) -> np.ndarray:
        """The ids before the first EOS id (all of them when none)."""
        hits = np.flatnonzero(np.isin(self.ids, np.asarray(self.eos_ids, np.int64)))
        return self.ids[: hits[0]] if hits.size else self.ids


def _rows(prompt_ids: Any, real_tokens: int) -> tuple[bool, list[np.ndarray]]:
    """`(single, rows)`: one prompt (1-D ids, may be empty) or a sequence of them."""
    arr = np.asarray(prompt_ids) if isinstance(prompt_ids, np.ndarray | jax.Array) else None
    single = arr is not None and arr.ndim == 1
    if arr is None:
        items = list(prompt_ids)
        single = not items or not isinstance(items[0], Sequence | np.ndarray)
    prompts = [prompt_ids] if single else list(prompt_ids)
    if not prompts:
        raise ValueError("prompt_ids: expected at least one prompt")
    rows = []
    for i, p in enumerate(prompts):
        row = np.asarray(p, dtype=np.int64).reshape(-1) if len(p) else np.zeros(0, np.int64)
        if row.size and (row.min() < 0 or row.max() >= real_tokens):
            raise ValueError(
                f"prompt_ids[{i}]: ids must lie in [0, {real_tokens}) (the data's real tokens; "
                f"the mask id is never a prompt id), got min {row.min()} max {row.max()}"
            )
        rows.append(row.astype(np.int32))
    return single, rows


class CanvasGeneration(CompileStats):
    """Generate by filling a canvas (see the module docstring and `Canvas`).

    model: a `CausalTransformer` (trained bidirectionally, e.g. by
    `MaskedDiffusionObjective`); variables: its variables (or `bind` them later);
    canvas: a `Canvas`. Calling it with prompt ids (one 1-D sequence, possibly empty, or a
    sequence of them), `gen_length`, a key (or int seed) and a `Sampling` returns one
    `CanvasOutput` or a list. It gives no per-token likelihoods: the RL rollouts refuse it.
    """

    canvas_generator: ClassVar[bool] = True

    def __init__(self, model: CausalTransformer, variables: Any = None, *, canvas: Canvas):
        if not isinstance(model, CausalTransformer):
            raise TypeError(f"model: expected a CausalTransformer, got {type(model).__name__}")
        if not isinstance(canvas, Canvas):
            raise TypeError(f"canvas: expected a Canvas, got {type(canvas).__name__}")
        vocab = model.config.vocab_size
        if canvas.mask_id >= vocab:
            raise ValueError(f"mask_id: {canvas.mask_id} is outside the model's vocab_size={vocab}")
        self.model, self.canvas = model, canvas
        self.variables: Mapping[str, Any] | None = None
        self.programs = ProgramCache()
        if variables is not None:
            self.bind(variables)

    def bind(self, snapshot: Any) -> CanvasGeneration:
        """Use these weights (a variables mapping, or an object whose `.params` is one)."""
        self.variables = variables_of(snapshot)
        return self

    def _check(self, rows: list[np.ndarray], gen_length: Any, sampling: Any) -> int:
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling: expected a Sampling, got {type(sampling).__name__}")
        if sampling.return_support:
            raise ValueError("sampling.return_support: a canvas records no per-draw supports")
        if isinstance(gen_length, bool) or not isinstance(gen_length, int) or gen_length < 1:
            raise ValueError(f"gen_length: expected a positive int, got {gen_length!r}")
        self.canvas.blocks(gen_length)
        width = max(r.size for r in rows)
        limit = self.model.config.max_seq_len
        if width + gen_length > limit:
            raise ValueError(
                f"gen_length: a canvas of {width} prompt + {gen_length} generated ids is longer "
                f"than the model's max_seq_len={limit}"
            )
        if self.canvas.block_causal:
            for i, r in enumerate(rows):
                if r.size % self.canvas.block_length:  # type: ignore[operator]
                    raise ValueError(
                        f"prompt_ids[{i}]: length {r.size} is not a multiple of block_length="
                        f"{self.canvas.block_length} (block-causal blocks start at position 0)"
                    )
        return width

    def __call__(
        self, prompt_ids: Any, gen_length: int, key: Any, sampling: Sampling | None = None
    ) -> CanvasOutput | list[CanvasOutput]:
        if self.variables is None:
            raise RuntimeError("CanvasGeneration: call bind(variables) before generating")
        sampling = Sampling() if sampling is None else sampling
        single, rows = _rows(prompt_ids, self.canvas.real_tokens)
        width = self._check(rows, gen_length, sampling)
        n = bucket(len(rows), minimum=1)
        prompts = np.zeros((n, width), np.int32)
        lengths = np.zeros((n,), np.int32)
        for i, row in enumerate(rows):
            prompts[i, width - row.size :] = row
            lengths[i] = row.size
        args = (self.variables, prompts, lengths, as_key(key))
        program = self.programs.get(
            (n, width, gen_length, sampling, tree_signature(self.variables)),
            lambda: _program(self.model, self.canvas, sampling, gen_length),
            args,
        )
        ids, order = jax.device_get(program(*args))
        eos = sampling.eos_ids
        outs = [CanvasOutput(ids[i, width:], order[i, width:], eos) for i in range(len(rows))]
        return outs[0] if single else outs


def _program(model: CausalTransformer, canvas: Canvas, sampling: Sampling, gen_length: int):
    """The compiled function `(variables, prompts [B, P], lengths [B], key) -> (ids, order)`."""
    if canvas.block_causal and canvas.kv_cache:
        return _cached_program(model, canvas, sampling, gen_length)
    block = canvas.block_length if canvas.block_causal else None

    def run(variables, prompts, lengths, key):
        b, p = prompts.shape
        width = p + gen_length
        start = (p - lengths)[:, None]
        columns = jnp.arange(width)[None, :]
        segments = (columns >= start).astype(jnp.int32)
        positions = jnp.maximum(columns - start, 0).astype(jnp.int32)
        masks = jnp.full((b, gen_length), canvas.mask_id, jnp.int32)
        ids = jnp.concatenate([prompts, masks], axis=1)
        vocab = model.config.vocab_size

        def logits_fn(x):
            return model.apply(variables, x, segments, positions, causal=False, block_size=block)

        def draws(index):
            return jax.random.uniform(jax.random.fold_in(key, index), (b, width, vocab))

        return fill(logits_fn, ids, p, canvas, sampling, draws)

    return run


def _cached_program(model: CausalTransformer, canvas: Canvas, sampling: Sampling, gen_length: int):
    """`_program`'s function for a block-causal canvas with a cache of finished blocks."""
    block = canvas.block_length

    def run(variables, prompts, lengths, key):
        b, p = prompts.shape
        width = p + gen_length
        masks = jnp.full((b, gen_length), canvas.mask_id, jnp.int32)
        ids = jnp.concatenate([prompts, masks], axis=1)
        vocab = model.config.vocab_size
        if p:
            _, cache = model.apply(
                variables, prompts, lengths, width, block_size=block, method="prefill"
            )
        else:
            cache = empty_cache(model.config, b, width)

        def chunk_fn(x, cache):
            return model.apply(variables, x, cache, method="extend")

        def draws(index):
            return jax.random.uniform(jax.random.fold_in(key, index), (b, width, vocab))

        return fill_cached(chunk_fn, cache, ids, p, canvas, sampling, draws)

    return run

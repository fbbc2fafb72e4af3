"""Key spans for BD3-LM's two-copy attention pass (`two_copy_visible`).

A row `[x_t, x_0]` of length `2L` holds a noised copy (indices `< L`) and a clean copy
(the rest), both at the same positions. Under `dew.models.layers.two_copy_visible` only
about a quarter of the `2L x 2L` score grid can be visible, so the attention reads, for
each chunk of queries, only the keys that chunk may see:

* a clean chunk (indices `L + s .. L + e - 1`) sees clean keys up to the end of its
  last block: one span from `L`;
* a noised chunk (`s .. e - 1`) sees its own noised blocks and the clean blocks before
  them: two spans, scored separately, soft-maxed together and summed.

The spans assume what `dew.models.layers.key_span` assumes for block-causal attention:
inside a segment, positions go up by one per index. They do not assume blocks start at
multiples of the block size, since packed documents restart their positions (and so
their blocks) at their first token; a query's block then reaches at most `S - 1`
indices to either side of it. The mask still decides visibility inside every span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

# The same fill as dew.models.layers.NEG_INF (hidden scores), kept here to avoid a cycle.
_HIDDEN = float(jnp.finfo(jnp.float32).min)


@dataclasses.dataclass(frozen=True)
class TwoCopy:
    """The static marker of the two-copy pass: passed where a block size goes.

    `DecoderLayer` and `Attention` take it as their `block_size` argument, which is
    already static under gradient checkpointing, so no new argument is needed.
    """

    size: int


def noised_spans(start: int, end: int, half: int, size: int) -> tuple[tuple[int, int], ...]:
    """Key spans `[low, high)` that noised queries `[start, end)` (`end <= half`) may see.

    First the noised keys of their own blocks (`S - 1` indices either side, clipped to
    the noised copy), then the clean keys strictly before the last query (a clean key
    is visible only from a later block, so its index is below the query's). The clean
    span is left out when it is empty.
    """
    own = (max(0, start - size + 1), min(half, end + size - 1))
    if end - 1 <= 0:
        return (own,)
    return own, (half, half + end - 1)


def clean_span(start: int, end: int, half: int, size: int) -> tuple[int, int]:
    """The key span that clean queries `[half + start, half + end)` may see.

    Clean keys from the clean copy's first up to the last query's block end, at most
    `S - 1` indices after it.
    """
    return half, half + min(half, end + size - 1)


def _scored(
    scores: Callable[[jax.Array, jax.Array], jax.Array],
    q: jax.Array,
    keys: jax.Array,
    mask: jax.Array,
    rows: tuple[int, int],
    span: tuple[int, int],
) -> jax.Array:
    """Masked float32 scores `[B, KVH, G, C, S]` of query rows `rows` against `span`."""
    (start, end), (low, high) = rows, span
    block = mask[:, None, None, start:end, low:high]
    return jnp.where(block, scores(q[:, start:end], keys[:, :, low:high]), _HIDDEN)


def _attend(
    scores: Callable[[jax.Array, jax.Array], jax.Array],
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    rows: tuple[int, int],
    spans: tuple[tuple[int, int], ...],
) -> jax.Array:
    """Attention of query rows `rows` over the union of `spans`: `[B, C, H * Dh]`.

    One softmax over the concatenated spans' scores; each span's share of the
    probabilities weighs its own values and the outputs are summed.
    """
    parts = [_scored(scores, q, keys, mask, rows, span) for span in spans]
    probs = jax.nn.softmax(parts[0] if len(parts) == 1 else jnp.concatenate(parts, -1), -1)
    out = None
    offset = 0
    for low, high in spans:
        share = probs[..., offset : offset + high - low].astype(values.dtype)
        offset += high - low
        term = jnp.einsum("bkgts,bksd->btkgd", share, values[:, :, low:high])
        out = term if out is None else out + term
    assert out is not None
    b, c = out.shape[:2]
    return out.reshape(b, c, -1)


def two_copy_attention(
    scores: Callable[[jax.Array, jax.Array], jax.Array],
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    size: int,
    chunk: int,
) -> jax.Array:
    """The two-copy pass's attention before the output projection: `[B, 2L, H * Dh]`.

    q `[B, 2L, H, Dh]`; keys, values `[B, KVH, 2L, Dh]`; mask bool `[B, 2L, 2L]` holding
    `two_copy_visible` and the segments; `scores(q, k)` gives the scaled float32 scores
    `[B, KVH, G, C, S]`. Each copy is cut into query chunks of `chunk` indices, so no
    chunk mixes the two copies, and each chunk reads only the key spans it may see.
    """
    half = q.shape[1] // 2
    outputs = []
    for start in range(0, half, chunk):
        end = min(start + chunk, half)
        spans = noised_spans(start, end, half, size)
        outputs.append(_attend(scores, q, keys, values, mask, (start, end), spans))
    for start in range(0, half, chunk):
        end = min(start + chunk, half)
        span = clean_span(start, end, half, size)
        rows = (half + start, half + end)
        outputs.append(_attend(scores, q, keys, values, mask, rows, (span,)))
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=1)


__all__ = ["TwoCopy", "clean_span", "noised_spans", "two_copy_attention"]

"""Scoring a model's next-token predictions: the pieces LM, DPO and GRPO share.

- ``target_log_probs(logits [B, T, V], targets [B, T]) -> [B, T]``: log-probability of each
  target, ``logits[target] - logsumexp(logits)`` in float32, which never builds a second
  ``[B, T, V]`` array. With a sampling support it renormalises over the kept ids only.
- ``token_nll``: the same as a negative log-likelihood, with whether the argmax was right.
- ``same_chain(segment_ids [B, T]) -> [B, T - 1]``: which next-token transitions stay inside
  one packed chain (document) and are not padding (segment 0).
- ``positions_from_segments(segment_ids [B, T]) -> [B, T]``: positions restarting at 0 where
  the segment id changes.
- ``packed_log_probs``: one forward over packed rows, each id scored given its own chain;
  ``packed_log_probs_and_entropy`` also returns each prediction's entropy from that forward.
- ``nll_sums``: summed NLL, correct targets and their count over a mask, for ``evaluate``.
- ``summarize_nll``: token loss, perplexity (and accuracy) from summed evaluation totals.

Convention: a row of ``T + 1`` ids is read as inputs ``ids[:, :-1]`` and targets
``ids[:, 1:]``; masks over targets are shifted the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.rl import token_entropy

PERPLEXITY_CAP = 700.0  # exp(700) is near the float64 limit; a larger mean loss reports exp(700)


def _support_logsumexp(
    logits: jax.Array, support_ids: jax.Array, support_columns: jax.Array, full: jax.Array
) -> jax.Array:
    """``[B, T]`` logsumexp over each target column's kept ids (``full`` where none are kept)."""
    width = logits.shape[1]
    valid = (support_columns >= 1) & (support_ids >= 0)
    column = jnp.where(valid, support_columns - 1, width)  # ``width`` is a drop bucket
    safe_column = jnp.clip(column, 0, width - 1)
    safe_id = jnp.clip(support_ids, 0, logits.shape[-1] - 1)
    values = jax.vmap(lambda row, c, i: row[c, i])(logits, safe_column, safe_id)
    values = jnp.where(valid, values, -jnp.inf)

    def row_lse(v: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        top = jax.ops.segment_max(v, c, num_segments=width + 1)[:width]
        top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
        shifted = jnp.where(c < width, v - top[jnp.clip(c, 0, width - 1)], -jnp.inf)
        total = jax.ops.segment_sum(jnp.exp(shifted), c, num_segments=width + 1)[:width]
        counts = jax.ops.segment_sum(jnp.ones_like(c), c, num_segments=width + 1)[:width]
        return jnp.log(jnp.where(total > 0, total, 1.0)) + top, counts

    support_lse, counts = jax.vmap(row_lse)(values, column)
    return jnp.where(counts > 0, support_lse, full)


def target_log_probs(
    logits: jax.Array,
    targets: jax.Array,
    support_ids: jax.Array | None = None,
    support_columns: jax.Array | None = None,
) -> jax.Array:
    """``[B, T]`` log-prob of ``targets[:, t]`` under ``logits[:, t]`` (float32).

    Without a support the log-softmax runs over the whole vocabulary. With one
    (``support_ids``/``support_columns`` ``[B, K]``, -1 padded), a target column that has kept
    ids is normalised over those ids only (the sampler's filtered distribution);
    ``support_columns`` index the *input row's* columns, so target column ``t`` is column
    ``t + 1`` there and column 0 never matches.
    """
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    full = jax.nn.logsumexp(logits, axis=-1)
    if support_ids is None or support_columns is None:
        return picked - full
    return picked - _support_logsumexp(logits, support_ids, support_columns, full)


def token_nll(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood and correctness.

    Args:
      logits: float ``[B, T, V]``.
      targets: int ``[B, T]``.
    Returns:
      ``(nll [B, T] float32, correct [B, T] bool)``; ``correct`` is ``argmax == target``.
    """
    correct = jnp.argmax(logits, axis=-1) == targets
    return -target_log_probs(logits, targets), correct


def nll_sums(nll: jax.Array, correct: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Evaluation sums over the targets ``mask`` keeps (all ``[B, T]``).

    Returns ``loss`` (summed NLL), ``correct`` (targets whose argmax was right) and ``weight``
    (kept targets), float32 scalars, the totals ``summarize_nll`` reads.
    """
    return {
        "loss": jnp.sum(jnp.where(mask, nll, 0.0)),
        "correct": jnp.sum(jnp.where(mask, correct, False).astype(jnp.float32)),
        "weight": jnp.sum(mask.astype(jnp.float32)),
    }


def check_text_batch(
    batch: Mapping[str, jax.Array], owner: str, width: int, fields: tuple[str, ...]
) -> None:
    """Check a token-file batch: a ``text`` field, and each of ``fields`` present ``[B, width]``.

    owner names the objective in the error (``batch: LMObjective needs a 'text' field``);
    width is ``seq_len + 1`` for the objectives that read ``TokenFile`` rows.
    """
    if "text" not in batch:
        raise KeyError(f"batch: {owner} needs a 'text' field, got {sorted(batch)}")
    for name in fields:
        if name in batch and (batch[name].ndim != 2 or batch[name].shape[1] != width):
            raise ValueError(
                f"batch[{name!r}]: expected shape [B, {width}] (seq_len + 1), "
                f"got {tuple(batch[name].shape)}"
            )


def same_chain(segment_ids: jax.Array) -> jax.Array:
    """``[B, T - 1]`` bool: target ``t + 1`` shares input ``t``'s segment and is not padding.

    ``segment_ids`` ``[B, T]`` numbers the packed chains of each row, 0 for padding (the same
    rule the decoder's attention mask uses). A transition across two chains, into padding or
    out of it never counts.
    """
    return (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """Positions ``[B, T]`` int32 restarting at 0 wherever the segment id changes.

    ``[[1, 1, 2, 2, 2, 0]] -> [[0, 1, 0, 1, 2, 0]]``; a run of padding is numbered like any
    other run (its positions are never attended to).
    """
    idx = jnp.broadcast_to(jnp.arange(segment_ids.shape[1], dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    first = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - first


def _packed_logits(
    model: Any,
    variables: Mapping[str, Any],
    batch: Mapping[str, jax.Array],
    temperature: float | None,
) -> jax.Array:
    """``[B, W - 1, V]`` float32 logits of packed rows, divided by ``temperature`` if given."""
    ids = jnp.asarray(batch["input_ids"])
    segments = jnp.asarray(batch["text_segment_ids"])
    positions = jnp.asarray(batch["text_positions"])
    logits = model.apply(
        variables, ids[:, :-1], segment_ids=segments[:, :-1], positions=positions[:, :-1]
    )
    logits = logits.astype(jnp.float32)
    if temperature is not None:
        logits = logits / jnp.asarray(temperature, logits.dtype)
    return logits


def _scored(logits: jax.Array, batch: Mapping[str, jax.Array]) -> jax.Array:
    """``[B, W]`` log-probs of each id from ``_packed_logits`` (0 at chain starts, padding)."""
    ids = jnp.asarray(batch["input_ids"])
    segments = jnp.asarray(batch["text_segment_ids"])
    scored = target_log_probs(
        logits, ids[:, 1:], batch.get("support_ids"), batch.get("support_columns")
    )
    scored = jnp.where(same_chain(segments), scored, 0.0)
    return jnp.concatenate([jnp.zeros_like(scored[:, :1]), scored], axis=1)


def packed_log_probs(
    model: Any,
    variables: Mapping[str, Any],
    batch: Mapping[str, jax.Array],
    temperature: float | None = None,
) -> jax.Array:
    """``[B, W]`` log-probability of each id given its own chain's prefix.

    The model reads ``input_ids[:, :-1]`` with the rows' ``text_segment_ids`` and
    ``text_positions``, so no id attends across chains. Column ``t`` holds the log-prob of
    ``input_ids[:, t]`` predicted from column ``t - 1``; the first id of every chain, padding
    and column 0 get 0. ``temperature`` divides the logits first (after any softcap the model
    applies); ``support_ids``/``support_columns`` in the batch renormalise the sampled columns
    over their kept ids.
    """
    return _scored(_packed_logits(model, variables, batch, temperature), batch)


def packed_log_probs_and_entropy(
    model: Any,
    variables: Mapping[str, Any],
    batch: Mapping[str, jax.Array],
    temperature: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``packed_log_probs`` and, from the same forward, ``[B, W]`` next-token entropies.

    Column ``t`` of the entropy is ``dew.rl.token_entropy`` of the distribution that predicted
    ``input_ids[:, t]`` (the logits at column ``t - 1``, divided by ``temperature``), over the
    whole vocabulary as verl 0.9.1's ``entropy_from_logits`` takes it (a batch's sampling
    support renormalises the log-probs, not the entropy); 0 where the log-prob is 0 (chain
    starts, padding, column 0). float32.
    """
    logits = _packed_logits(model, variables, batch, temperature)
    segments = jnp.asarray(batch["text_segment_ids"])
    entropy = jnp.where(same_chain(segments), token_entropy(logits), 0.0)
    entropy = jnp.concatenate([jnp.zeros_like(entropy[:, :1]), entropy], axis=1)
    return _scored(logits, batch), entropy


def summarize_nll(totals: Mapping[str, float], *, accuracy: bool) -> dict[str, float]:
    """Token ``loss`` (mean NLL), ``perplexity`` and ``tokens`` from summed evaluation totals.

    ``totals`` holds ``loss`` (summed NLL), ``weight`` (scored tokens) and, when ``accuracy``
    is set, ``correct`` (tokens whose argmax was right), which adds ``accuracy``. No scored
    token gives nan for every mean. The perplexity is ``exp`` of the mean loss, capped at
    ``exp(PERPLEXITY_CAP)`` so it stays a finite float.
    """
    weight = totals.get("weight", 0.0)
    if weight <= 0:
        out = {"loss": math.nan, "perplexity": math.nan}
        if accuracy:
            out["accuracy"] = math.nan
        return {**out, "tokens": 0.0}
    loss = totals["loss"] / weight
    out = {"loss": loss, "perplexity": math.exp(min(loss, PERPLEXITY_CAP))}
    if accuracy:
        out["accuracy"] = totals["correct"] / weight
    return {**out, "tokens": weight}


__all__ = [
    "PERPLEXITY_CAP",
    "nll_sums",
    "packed_log_probs",
    "packed_log_probs_and_entropy",
    "positions_from_segments",
    "same_chain",
    "summarize_nll",
    "target_log_probs",
    "token_nll",
]

"""Token sampling controls and a jit-safe sampler that records both likelihoods.

`Sampling` is a frozen, hashable value (it is part of compiled programs' keys).
`draw(logits, key, sampling)` picks one id per row and returns:

* `raw_log_probs`: log-softmax of the model's logits at the chosen id, the
  likelihood of the unmodified policy (what GRPO calls the old policy);
* `behavior_log_probs`: the log-likelihood under the distribution actually
  sampled from: logits softcapped (if `softcap`), divided by `temperature`,
  restricted by top-k, then top-p, then min-p, renormalised. Greedy decoding
  (temperature 0) is deterministic, so its behavior log-probability is 0;
* `support`: with `return_support=True`, the ids the filters kept for each
  draw, `[B, K]` sorted by decreasing logit and padded with -1, where K is
  `top_k` when set and the vocabulary size otherwise.

Filter conventions follow vLLM's sampler (v0.30.0 `topk_topp_sampler`): top-k
keeps exactly k ids (ties broken by `lax.top_k`'s order); top-p keeps the
smallest prefix of the sorted distribution whose mass reaches `top_p` (an id
is kept when the mass strictly before it is below `top_p`, so the most likely
id always stays); min-p keeps ids whose probability is at least
`min_p * max_probability`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dew.checks import is_int


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How to pick tokens.

    temperature: 0 for greedy, else > 0. top_k: keep the k most likely ids
    (None or 0: off). top_p: nucleus mass in (0, 1] (1: off). min_p: in [0, 1)
    (0: off). eos_id: an id or a tuple of ids that end a response (None: none).
    softcap: if set, logits become softcap * tanh(logits / softcap) before the
    temperature. return_support: also return the kept ids of each draw.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    eos_id: int | tuple[int, ...] | None = None
    softcap: float | None = None
    return_support: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k: expected None or an int >= 0, got {self.top_k!r}")
        if self.top_k == 0:
            object.__setattr__(self, "top_k", None)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a value in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p: expected a value in [0, 1), got {self.min_p}")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap: expected None or > 0, got {self.softcap}")
        eos = self.eos_id
        if eos is not None and not isinstance(eos, int):
            eos = tuple(eos)
            if not eos:
                raise ValueError("eos_id: expected an id or a non-empty tuple of ids, got ()")
            object.__setattr__(self, "eos_id", eos)
        for value in self.eos_ids:
            if not is_int(value) or value < 0:
                raise ValueError(f"eos_id: expected non-negative ints, got {self.eos_id!r}")
        if self.return_support and self.greedy is False and self.top_k is None and self.top_p == 1:
            raise ValueError("return_support: needs a finite top_k or a top_p below 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.eos_id is None:
            return ()
        if isinstance(self.eos_id, int):
            return (self.eos_id,)
        return tuple(self.eos_id)

    def support_width(self, vocab_size: int) -> int:
        """K of the support array for a vocabulary of `vocab_size`."""
        if self.greedy:
            return 1
        return min(self.top_k, vocab_size) if self.top_k else vocab_size


class Draw(NamedTuple):
    """One sampled id per row: ids int32 `[B]`, raw and behavior log-probs float32 `[B]`,
    support int32 `[B, K]` (-1 padded) or None."""

    ids: jax.Array
    raw_log_probs: jax.Array
    behavior_log_probs: jax.Array
    support: jax.Array | None


def is_eos(ids: jax.Array, sampling: Sampling) -> jax.Array:
    """Boolean mask of `ids` that are one of the sampling's EOS ids."""
    hit = jnp.zeros(ids.shape, bool)
    for value in sampling.eos_ids:
        hit = hit | (ids == value)
    return hit


def first_argmax(x: jax.Array) -> jax.Array:
    """Index of the first maximum along the last axis, int32 (NaN counts as the maximum,
    as in `jnp.argmax`). Two plain reductions: on CPU, XLA's fused (value, index)
    reduction behind `jnp.argmax` is several times slower."""
    top = jnp.max(x, axis=-1, keepdims=True)
    size = x.shape[-1]
    idx = jnp.arange(size, dtype=jnp.int32)
    hit = (x == top) | jnp.isnan(x)
    return jnp.minimum(jnp.min(jnp.where(hit, idx, size), axis=-1), size - 1).astype(jnp.int32)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits) by the Gumbel-max trick, int32 `[B]`."""
    return first_argmax(logits + jax.random.gumbel(key, logits.shape, jnp.float32))


def _pick(values: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take_along_axis(values, index[:, None], axis=-1)[:, 0]


def draw(logits: jax.Array, key: jax.Array, sampling: Sampling) -> Draw:
    """Sample one id per row of float `[B, V]` logits (jit-safe; `sampling` is static)."""
    logits = logits.astype(jnp.float32)
    raw = jax.nn.log_softmax(logits, axis=-1)
    x = logits
    if sampling.softcap is not None:
        cap = jnp.float32(sampling.softcap)
        x = cap * jnp.tanh(x / cap)
    if sampling.greedy:
        ids = first_argmax(x)
        support = ids[:, None] if sampling.return_support else None
        zero = jnp.zeros(ids.shape, jnp.float32)
        return Draw(ids, _pick(raw, ids), zero, support)
    x = x / jnp.float32(sampling.temperature)
    needs_sorted = sampling.top_k is not None or sampling.top_p < 1 or sampling.return_support
    if not needs_sorted:
        if sampling.min_p > 0:
            probs = jax.nn.softmax(x, axis=-1)
            floor = sampling.min_p * probs.max(axis=-1, keepdims=True)
            x = jnp.where(probs >= floor, x, -jnp.inf)
        ids = categorical(key, x)
        behavior = _pick(jax.nn.log_softmax(x, axis=-1), ids)
        return Draw(ids, _pick(raw, ids), behavior, None)
    # Work on candidates sorted by decreasing logit: the top k, or the whole vocabulary.
    k = min(sampling.top_k or x.shape[-1], x.shape[-1])
    values, candidates = jax.lax.top_k(x, k)
    keep = jnp.ones(values.shape, bool)
    if sampling.top_p < 1:
        probs = jax.nn.softmax(values, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = keep & (before < sampling.top_p)
    if sampling.min_p > 0:
        probs = jax.nn.softmax(jnp.where(keep, values, -jnp.inf), axis=-1)
        keep = keep & (probs >= sampling.min_p * probs[:, :1])
    filtered = jnp.where(keep, values, -jnp.inf)
    choice = categorical(key, filtered)
    ids = _pick(candidates, choice).astype(jnp.int32)
    behavior = _pick(jax.nn.log_softmax(filtered, axis=-1), choice)
    support = None
    if sampling.return_support:
        support = jnp.where(keep, candidates, -1).astype(jnp.int32)
    return Draw(ids, _pick(raw, ids), behavior, support)

"""`TextGeneration`: a policy that samples responses from exact context ids.

One call prefills the left-padded batch of contexts once (each row's real
tokens packed into its cache) and runs the whole decode loop inside one
compiled program (`lax.while_loop`, which stops as soon as every row has
ended). For long budgets the loop is split into a few phases that attend over
growing windows of the cache, so early steps do not read its empty tail. Widths are bucketed: the batch to a power of two, the context width
and the response budget to powers of two (at least 16), so contexts of
different lengths reuse one program; `compile_count` says how many programs
were built.

Each response carries, per sampled id, the raw-policy log-probability and the
behavior log-probability (see `dew.sampling`), and says whether EOS ended it.
A row stops at its first EOS id (kept as its last id) or at its budget; rows
that stopped leave their cache alone while the others continue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.inference.compiled import CompileStats, ProgramCache, bucket
from dew.models.decoder import CausalTransformer
from dew.sampling import Sampling, draw, is_eos


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled response.

    ids: int32 `[n]`, EOS included when it ended the response. raw_log_probs,
    behavior_log_probs: float32 `[n]`. eos: True when an EOS id ended it,
    False when the budget did. support: int32 `[n, K]` kept ids per draw
    (-1 padded) when the Sampling asked for them, else None.
    """

    ids: np.ndarray
    raw_log_probs: np.ndarray
    behavior_log_probs: np.ndarray
    eos: bool
    support: np.ndarray | None = None

    @property
    def finish_reason(self) -> str:
        return "eos" if self.eos else "length"

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def variables_of(snapshot: Any) -> Mapping[str, Any]:
    """A variables mapping from a snapshot: the mapping itself or an object's `.params`."""
    if isinstance(snapshot, Mapping) and "params" in snapshot:
        return snapshot
    inner = getattr(snapshot, "params", None)
    if isinstance(inner, Mapping) and "params" in inner:
        return inner
    raise TypeError(
        "snapshot: expected a variables mapping with a 'params' collection (or an object "
        f"whose .params is one), got {type(snapshot).__name__}"
    )


def as_key(key: Any) -> jax.Array:
    """A typed PRNG key from a typed key, raw uint32 key data or an int seed."""
    if isinstance(key, int):
        return jax.random.key(key)
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.wrap_key_data(key)


def check_context(name: str, ids: Any, vocab_size: int) -> np.ndarray:
    """Validate one context as a non-empty 1-D int array of ids below vocab_size."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence of ids, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected integer ids, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(
            f"{name}: ids must lie in [0, {vocab_size}), got min {arr.min()} max {arr.max()}"
        )
    return arr.astype(np.int32)


def attention_windows(prompt_width: int, capacity: int, minimum: int = 128) -> list[int]:
    """Growing attention windows for a decode loop: a few sizes (x4 apart, from
    `minimum`) above the prompt width, ending at the capacity."""
    windows = []
    size = minimum
    while size < capacity:
        if size > prompt_width:
            windows.append(size)
        size *= 4
    return [*windows, capacity]


def _generate(model: CausalTransformer, sampling: Sampling, capacity: int) -> Any:
    def run(variables, prompts, lengths, budgets, key):
        b, p = prompts.shape
        width = capacity - p
        logits, cache = model.apply(variables, prompts, lengths, capacity, method="prefill")
        first = draw(logits, jax.random.fold_in(key, 0), sampling)
        k = first.support.shape[-1] if first.support is not None else 0
        ids = jnp.zeros((b, width), jnp.int32).at[:, 0].set(first.ids)
        raw = jnp.zeros((b, width), jnp.float32).at[:, 0].set(first.raw_log_probs)
        beh = jnp.zeros((b, width), jnp.float32).at[:, 0].set(first.behavior_log_probs)
        sup = jnp.full((b, width, k), -1, jnp.int32)
        if first.support is not None:
            sup = sup.at[:, 0].set(first.support)
        ended = is_eos(first.ids, sampling)
        count = jnp.ones((b,), jnp.int32)
        done = ended | (count >= budgets)
        state = (jnp.int32(1), first.ids, done, ended, count, cache, ids, raw, beh, sup)

        def body(state, window):
            step, tok, done, ended, count, cache, ids, raw, beh, sup = state
            live = ~done
            logits, cache = model.apply(variables, tok, cache, live, window, method="decode")
            out = draw(logits, jax.random.fold_in(key, step), sampling)
            new = jnp.where(live, out.ids, 0)
            ids = jax.lax.dynamic_update_slice(ids, new[:, None], (0, step))
            zero = jnp.zeros_like(out.raw_log_probs)
            raw = jax.lax.dynamic_update_slice(
                raw, jnp.where(live, out.raw_log_probs, zero)[:, None], (0, step)
            )
            beh = jax.lax.dynamic_update_slice(
                beh, jnp.where(live, out.behavior_log_probs, zero)[:, None], (0, step)
            )
            if out.support is not None:
                kept = jnp.where(live[:, None], out.support, -1)
                sup = jax.lax.dynamic_update_slice(sup, kept[:, None, :], (0, step, 0))
            count = count + live.astype(jnp.int32)
            hit = live & is_eos(out.ids, sampling)
            ended = ended | hit
            done = done | hit | (count >= budgets)
            tok = jnp.where(live, out.ids, tok)
            return step + 1, tok, done, ended, count, cache, ids, raw, beh, sup

        # Step s writes the previous token at slot length + s - 1 <= p + s - 1, so a
        # loop attending over `window` slots may run while s <= window - p.
        for window in attention_windows(p, capacity):

            def cond(state, window=window):
                step, _, done = state[:3]
                return (step < width) & (step <= window - p) & ~jnp.all(done)

            sized = None if window == capacity else window
            state = jax.lax.while_loop(cond, lambda st, w=sized: body(st, w), state)
        _, _, _, ended, count, _, ids, raw, beh, sup = state
        return ids, raw, beh, sup, count, ended

    return run


class TextGeneration(CompileStats):
    """Sample responses from a decoder for exact context ids.

    model: a `CausalTransformer`; variables: its variables (or bind them later). A
    `LoraDecoder` with `{"params": adapter, "base": base params}` samples through the
    adapter applied on the fly (`dew.inference.adapter.with_adapter` builds the pair).
    min_bucket: the smallest padded context width and response budget.

    Call with one context (a 1-D sequence of ids) to get one `Generation`, or a
    sequence of contexts to get a list; `max_new_tokens` is an int or one per
    context; `key` is a PRNG key (or an int seed); `sampling` a `Sampling`.
    """

    def __init__(
        self,
        model: CausalTransformer,
        variables: Any = None,
        *,
        min_bucket: int = 16,
    ) -> None:
        if not isinstance(model, CausalTransformer):
            raise TypeError(f"model: expected a CausalTransformer, got {type(model).__name__}")
        self.model = model
        self.variables: Mapping[str, Any] | None = None
        self.min_bucket = min_bucket
        self.programs = ProgramCache()
        if variables is not None:
            self.bind(variables)

    def bind(self, snapshot: Any) -> TextGeneration:
        """Use these weights (a variables mapping, or an object whose `.params` is one)."""
        self.variables = variables_of(snapshot)
        return self

    def __call__(
        self,
        context_ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
        max_new_tokens: int | Sequence[int],
        key: Any,
        sampling: Sampling,
    ) -> Generation | list[Generation]:
        if self.variables is None:
            raise RuntimeError("TextGeneration: call bind(variables) before generating")
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling: expected a Sampling, got {type(sampling).__name__}")
        single = _is_single(context_ids)
        contexts = [context_ids] if single else list(context_ids)  # type: ignore[list-item]
        if not contexts:
            raise ValueError("context_ids: expected at least one context")
        cfg = self.model.config
        rows = [
            check_context(f"context_ids[{i}]", c, cfg.vocab_size) for i, c in enumerate(contexts)
        ]
        if isinstance(max_new_tokens, int | np.integer):
            budgets = [int(max_new_tokens)] * len(rows)
        else:
            budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != len(rows):
            raise ValueError(
                f"max_new_tokens: expected one budget per context ({len(rows)}), got {len(budgets)}"
            )
        for i, (row, budget) in enumerate(zip(rows, budgets)):
            if budget < 1:
                raise ValueError(f"max_new_tokens[{i}]: expected >= 1, got {budget}")
            if row.shape[0] + budget > cfg.max_seq_len:
                raise ValueError(
                    f"context_ids[{i}]: {row.shape[0]} context ids + {budget} new tokens exceed "
                    f"the model's max_seq_len={cfg.max_seq_len}"
                )
        n = bucket(len(rows), minimum=1)
        width = bucket(max(r.shape[0] for r in rows), self.min_bucket)
        span = bucket(max(budgets), self.min_bucket)
        prompts = np.zeros((n, width), np.int32)
        lengths = np.ones((n,), np.int32)
        budget_arr = np.ones((n,), np.int32)
        for i, row in enumerate(rows):
            prompts[i, width - row.shape[0] :] = row
            lengths[i] = row.shape[0]
            budget_arr[i] = budgets[i]
        capacity = width + span
        args = (self.variables, prompts, lengths, budget_arr, as_key(key))
        program = self.programs.get(
            (n, width, span, sampling, tree_signature(self.variables)),
            lambda: _generate(self.model, sampling, capacity),
            args,
        )
        ids, raw, beh, sup, count, ended = jax.device_get(program(*args))
        out = []
        for i in range(len(rows)):
            c = int(count[i])
            out.append(
                Generation(
                    ids=ids[i, :c].copy(),
                    raw_log_probs=raw[i, :c].copy(),
                    behavior_log_probs=beh[i, :c].copy(),
                    eos=bool(ended[i]),
                    support=sup[i, :c].copy() if sampling.return_support else None,
                )
            )
        return out[0] if single else out


def _is_single(context_ids: Any) -> bool:
    """True for one context (1-D ids), False for a sequence of contexts."""
    if isinstance(context_ids, np.ndarray | jax.Array):
        return context_ids.ndim == 1
    items = list(context_ids)
    return not items or isinstance(items[0], int | np.integer)


def tree_signature(tree: Any) -> Any:
    """Structure, shapes and dtypes of a pytree (part of a compiled program's key)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), str(jnp.result_type(x))) for x in leaves)

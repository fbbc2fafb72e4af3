"""The compiled programs of the ``Server``: admit (prefill into slots) and decode (a loop of steps).

Both draw per row: row ``b`` uses its own key folded with its token index, so what a request
samples does not depend on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.models.decoder import CausalTransformer, KVCache
from dew.sampling import Draw, Sampling, draw, is_eos


def row_draw(logits: jax.Array, keys: jax.Array, counts: jax.Array, sampling: Sampling) -> Draw:
    """Per-row draws: row b uses its key folded with its token index."""
    if sampling.greedy:
        return draw(logits, jax.random.key(0), sampling)

    def one(row_logits, key_data, count):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), count)
        out = draw(row_logits[None], key, sampling)
        return jax.tree.map(lambda x: x[0], out)

    return jax.vmap(one)(logits, keys, counts)


def admit_program(model: CausalTransformer, sampling: Sampling, capacity: int) -> Callable:
    """Prefill new prompts ``[N, P]`` into their cache ``slots`` and draw each one's first id."""

    def admit(variables, cache, prompts, lengths, slots, keys):
        logits, fresh = model.apply(variables, prompts, lengths, capacity, method="prefill")
        out = row_draw(logits, keys, jnp.zeros_like(lengths), sampling)
        keys_ = tuple(
            big.at[slots].set(new, mode="drop") for big, new in zip(cache.keys, fresh.keys)
        )
        values = tuple(
            big.at[slots].set(new, mode="drop") for big, new in zip(cache.values, fresh.values)
        )
        lengths_ = cache.lengths.at[slots].set(fresh.lengths, mode="drop")
        return KVCache(keys_, values, lengths_), out, is_eos(out.ids, sampling)

    return admit


def decode_program(
    model: CausalTransformer, sampling: Sampling, steps: int, k: int, window: int
) -> Callable:
    """Decode every live slot up to ``steps`` ids in one loop (``k`` kept ids per draw when the
    sampling returns its support; ``window`` the static attention window)."""

    def decode(variables, cache, tok, live, count, budgets, keys):
        s = tok.shape[0]
        ids = jnp.zeros((s, steps), jnp.int32)
        raw = jnp.zeros((s, steps), jnp.float32)
        beh = jnp.zeros((s, steps), jnp.float32)
        made = jnp.zeros((s, steps), bool)
        eos = jnp.zeros((s,), bool)
        sup = jnp.full((s, steps, k), -1, jnp.int32)

        def cond(state):
            j, live = state[0], state[3]
            return (j < steps) & jnp.any(live)

        def body(state):
            j, cache, tok, live, count, eos, ids, raw, beh, made, sup = state
            logits, cache = model.apply(variables, tok, cache, live, window, method="decode")
            out = row_draw(logits, keys, count, sampling)
            col = (0, j)
            ids = jax.lax.dynamic_update_slice(ids, jnp.where(live, out.ids, 0)[:, None], col)
            raw = jax.lax.dynamic_update_slice(raw, out.raw_log_probs[:, None], col)
            beh = jax.lax.dynamic_update_slice(beh, out.behavior_log_probs[:, None], col)
            made = jax.lax.dynamic_update_slice(made, live[:, None], col)
            if out.support is not None:
                sup = jax.lax.dynamic_update_slice(sup, out.support[:, None, :], (0, j, 0))
            count = count + live.astype(jnp.int32)
            hit = live & is_eos(out.ids, sampling)
            eos = eos | hit
            tok = jnp.where(live, out.ids, tok)
            live = live & ~hit & (count < budgets)
            return j + 1, cache, tok, live, count, eos, ids, raw, beh, made, sup

        state = (jnp.int32(0), cache, tok, live, count, eos, ids, raw, beh, made, sup)
        _, cache, tok, live, count, eos, ids, raw, beh, made, sup = jax.lax.while_loop(
            cond, body, state
        )
        return cache, (tok, live, count, eos, ids, raw, beh, made, sup)

    return decode


__all__ = ["admit_program", "decode_program", "row_draw"]

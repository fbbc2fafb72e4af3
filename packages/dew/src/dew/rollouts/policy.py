"""A sampling policy bound to the policy part of a larger variables tree.

``SubtreePolicy(model, variables, pick)`` is what ``PPOObjective.policy(variables)`` returns
for ``EpisodeRollout``: it has ``bind(snapshot)`` and ``__call__(contexts, budgets, key,
sampling) -> [Generation]``. ``bind`` accepts either the objective's whole tree (policy and
critic, the Trainer's snapshot) or the policy's own variables, and keeps only the latter, so
the sampler never sees the critic.

A ``dew.models`` decoder samples through ``dew.inference.TextGeneration`` (KV cache, one
compiled loop). Any other model called as ``apply(variables, ids, segment_ids=, positions=)
-> logits [B, T, V]`` samples through a plain loop that runs the whole context again for each
new id (fine for the tiny policies of tests and examples, quadratic in length otherwise). Both
draw with ``dew.sampling.draw``, so each id carries its raw and behavior log-probabilities.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.inference import TextGeneration
from dew.inference.generation import Generation
from dew.models import CausalTransformer
from dew.sampling import Sampling, draw


@functools.partial(jax.jit, static_argnums=(0, 5))
def _next(
    model: Any,
    variables: Any,
    ids: jax.Array,
    lengths: jax.Array,
    key: jax.Array,
    sampling: Sampling,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One draw per row from the logits at each row's last real id (right-padded rows)."""
    columns = jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
    real = columns < lengths[:, None]
    logits = model.apply(
        variables,
        ids,
        segment_ids=real.astype(jnp.int32),
        positions=jnp.where(real, columns, 0),
    )
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    drawn = draw(last.astype(jnp.float32), key, sampling)
    return drawn.ids, drawn.raw_log_probs, drawn.behavior_log_probs


def generate(
    model: Any,
    variables: Any,
    contexts: Sequence[Any],
    budgets: Sequence[int],
    key: jax.Array,
    sampling: Sampling,
) -> list[Generation]:
    """Sample each context's response by re-running the model on the growing rows."""
    rows = [np.asarray(c, np.int32).reshape(-1) for c in contexts]
    budgets = [int(b) for b in budgets]
    width = max(r.size + b for r, b in zip(rows, budgets))
    ids = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        ids[i, : row.size] = row
    lengths = np.array([r.size for r in rows], np.int32)
    out: list[list[tuple[int, float, float]]] = [[] for _ in rows]
    done = np.zeros(len(rows), bool)
    ended = np.zeros(len(rows), bool)
    eos = set(sampling.eos_ids)
    for step in range(max(budgets)):
        picked, raw, behavior = jax.device_get(
            _next(model, variables, ids, lengths, jax.random.fold_in(key, step), sampling)
        )
        for i in np.flatnonzero(~done).tolist():
            token = int(picked[i])
            out[i].append((token, float(raw[i]), float(behavior[i])))
            ids[i, lengths[i]] = token
            lengths[i] += 1
            ended[i] = token in eos
            done[i] = ended[i] or len(out[i]) >= budgets[i]
        if done.all():
            break
    return [
        Generation(
            ids=np.asarray([t for t, _, _ in drawn], np.int32),
            raw_log_probs=np.asarray([r for _, r, _ in drawn], np.float32),
            behavior_log_probs=np.asarray([b for _, _, b in drawn], np.float32),
            eos=bool(end),
        )
        for drawn, end in zip(out, ended)
    ]


class SubtreePolicy:
    """Sample from ``model`` with the policy variables picked out of any snapshot.

    Args:
      model: the policy model.
      variables: its variables (or a whole tree ``pick`` reads them from).
      pick: ``tree -> policy variables``; applied when the tree holds more than the policy.
        None: every snapshot is the policy's own variables.
      holds_more: ``tree -> bool``, whether a snapshot is a whole tree to pick from.
    """

    def __init__(
        self,
        model: Any,
        variables: Mapping[str, Any],
        pick: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
        holds_more: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.model = model
        self._pick = pick if pick is not None else dict
        self._holds_more = holds_more if holds_more is not None else (lambda tree: False)
        self._generation = TextGeneration(model) if isinstance(model, CausalTransformer) else None
        self.variables: dict[str, Any] = {}
        self.bind(variables)

    def bind(self, snapshot: Any) -> SubtreePolicy:
        """Use the policy part of ``snapshot`` (a variables mapping or an object's ``.params``)."""
        tree = snapshot if isinstance(snapshot, Mapping) else getattr(snapshot, "params", None)
        if not isinstance(tree, Mapping) or "params" not in tree:
            raise TypeError(
                f"snapshot: expected a variables mapping with 'params' (or a TrainState), got "
                f"{type(snapshot).__name__}"
            )
        self.variables = self._pick(tree) if self._holds_more(tree) else dict(tree)
        if self._generation is not None:
            self._generation.bind(self.variables)
        return self

    def __call__(
        self,
        contexts: Sequence[Any],
        max_new_tokens: int | Sequence[int],
        key: Any,
        sampling: Sampling,
    ) -> list[Generation]:
        """One ``Generation`` per context (``max_new_tokens``: one budget or one per context)."""
        if self._generation is not None:
            out = self._generation(contexts, max_new_tokens, key, sampling)  # type: ignore[arg-type]
            return out if isinstance(out, list) else [out]
        budgets = (
            [int(max_new_tokens)] * len(contexts)
            if isinstance(max_new_tokens, int | np.integer)
            else [int(b) for b in max_new_tokens]
        )
        if len(budgets) != len(contexts):
            raise ValueError(
                f"max_new_tokens: expected one budget per context ({len(contexts)}), got "
                f"{len(budgets)}"
            )
        if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
            key = (
                jax.random.key(int(key)) if isinstance(key, int) else jax.random.wrap_key_data(key)
            )
        return generate(self.model, self.variables, contexts, budgets, key, sampling)


__all__ = ["SubtreePolicy", "generate"]

"""TrainState: everything a training run carries from one step to the next."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    """The full state of a run, a pytree the Trainer's compiled step donates and returns.

    Fields:
      step: int32 scalar, steps taken (a step whose batch counted no unit still counts).
      updates: int32 scalar, optimizer updates committed (a step with zero weight makes none).
      params: the full variables mapping ``{"params": ...}`` (other collections pass through).
      opt_state: the optax state of ``params["params"]``.
      ema: ``None``, a frozen reference (decay 1) or a moving average of ``params``.
      rng: a typed PRNG key, split once per step.
    """

    step: jax.Array
    updates: jax.Array
    params: Any
    opt_state: Any
    ema: Any
    rng: jax.Array

    @property
    def variables(self) -> Any:
        """Alias of ``params``: the full variables mapping."""
        return self.params


def place_owned(variables: Any, shardings: Any) -> Any:
    """``variables`` laid out as ``shardings`` says, reusing their buffers where they can be.

    A leaf already laid out that way keeps its buffer (the result shares it, no copy); one
    that must move is copied and the original donated (deleted) once the copy exists. A leaf
    object that occurs more than once gets a copy for each later occurrence, so no two
    leaves of the result share a buffer (the step donates every leaf and one buffer cannot
    be donated twice).
    """
    leaves, treedef = jax.tree.flatten(variables)
    targets = jax.tree.leaves(shardings)  # one sharding per leaf, in the same order
    if len(targets) != len(leaves):
        raise ValueError(f"shardings: expected {len(leaves)} leaves, got {len(targets)}")
    first: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        first.setdefault(id(leaf), i)
    repeats = [i for i, leaf in enumerate(leaves) if first[id(leaf)] != i]
    out = list(leaves)
    for i in repeats:  # before any donation below can delete the leaf they copy
        out[i] = jax.device_put(leaves[i], targets[i], may_alias=False)
    for j in first.values():
        out[j] = jax.device_put(leaves[j], targets[j], donate=True)
    return jax.tree.unflatten(treedef, out)


def take_over(
    init: Callable[[Any, jax.Array], TrainState],
    variables: Any,
    rng: jax.Array,
    shardings: TrainState,
) -> TrainState:
    """``init(variables, rng)`` under ``shardings`` whose ``params`` are ``variables`` themselves.

    The variables are placed with ``place_owned`` (no copy where they already lie as the
    state keeps them) and only the rest of the state (optimizer state, EMA or frozen
    reference, counters) is computed by a compiled ``init``. The caller gives up the
    variables: the first step that donates the state deletes their buffers wherever else
    they are still referenced.
    """
    placed = place_owned(variables, shardings.params)

    def rest(v: Any, key: jax.Array) -> TrainState:
        return dataclasses.replace(init(v, key), params=None)

    out = dataclasses.replace(shardings, params=None)
    state = jax.jit(rest, out_shardings=out)(placed, rng)
    return dataclasses.replace(state, params=placed)

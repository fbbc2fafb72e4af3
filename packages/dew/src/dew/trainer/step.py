"""The pure update function the Trainer compiles: accumulate, normalise, update, average.

One step takes a global batch ``[B, ...]``, splits it into ``k`` microbatches of ``B / k``
rows (row ``r`` goes to microbatch ``r % k``, which keeps each device's rows on that device),
sums ``loss_sum``, ``weight``, gradients of ``loss_sum`` and metrics over the microbatches, and
divides by the total weight of the step. Because the objective's ``weight`` (its count of loss
tokens, pairs ...) is treated as a constant, the gradient of ``sum(loss_sum) / sum(weight)`` is
``sum(grad loss_sum) / sum(weight)`` exactly: ``k`` microbatches give the update of one batch.

A step whose total weight is zero or whose loss is not finite leaves ``params``, ``opt_state``
and ``ema`` as they were (selected with ``jnp.where``) and does not count an update; the
Trainer raises on a non-finite loss.

Metrics: a metric named ``<name>_sum`` is summed and reported as ``<name>`` divided by the
total weight; any other metric is averaged over the microbatches weighted by their weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dew.objectives.base import Objective
from dew.trainer.state import TrainState

Metrics = dict[str, jax.Array]


def _split_microbatches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """``[B, ...]`` -> ``[k, B / k, ...]``, row ``r`` in microbatch ``r % k`` (0-d left out)."""

    def one(path: Any, x: jax.Array) -> jax.Array:
        if x.shape[0] % k:
            raise ValueError(
                f"batch{jax.tree_util.keystr(path)}: {x.shape[0]} rows do not split into "
                f"{k} microbatches"
            )
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map_with_path(one, batch)


def make_step(
    objective: Objective, optimizer: optax.GradientTransformation, microbatches: int = 1
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, Metrics]]:
    """The (uncompiled) step function ``(state, batch) -> (state, metrics)``."""
    decay = objective.ema_decay
    k = int(microbatches)
    if k < 1:
        raise ValueError(f"microbatches: expected an integer >= 1, got {microbatches!r}")

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Metrics]:
        rng, step_key = jax.random.split(state.rng)
        grad_one = _microbatch_grads(objective, state)
        ls, w, msum, gsum = _accumulate(grad_one, batch, step_key, k)
        safe = jnp.where(w > 0, w, 1.0)
        loss = jnp.where(w > 0, ls / safe, 0.0)
        grads = jax.tree.map(lambda g: g / safe.astype(g.dtype), gsum)
        ok = (w > 0) & jnp.isfinite(loss)
        new_state = _apply_update(optimizer, decay, state, grads, ok, rng)
        return new_state, _step_metrics(ls, loss, w, safe, grads, msum)

    return step


def _microbatch_grads(objective: Objective, state: TrainState) -> Callable[..., Any]:
    """``(microbatch, key) -> (loss_sum, weight, weighted metrics, grads)`` at ``state``."""
    params = state.params["params"]

    def grad_one(mb: dict[str, jax.Array], key: jax.Array):
        def f(p: Any):
            ls, w, m = objective.loss({**state.params, "params": p}, mb, key, state.ema)
            return jnp.asarray(ls, jnp.float32), (jax.lax.stop_gradient(w), m)

        (ls, (w, m)), g = jax.value_and_grad(f, has_aux=True)(params)
        w = jnp.asarray(w, jnp.float32)
        m = {
            name: (
                jnp.asarray(v, jnp.float32)
                if name.endswith("_sum")
                else jnp.where(w > 0, jnp.asarray(v, jnp.float32) * w, 0.0)
            )
            for name, v in m.items()
        }
        return ls, w, m, g

    return grad_one


def _accumulate(
    grad_one: Callable[..., Any], batch: dict[str, jax.Array], step_key: jax.Array, k: int
) -> Any:
    """``grad_one``'s outputs summed over ``k`` microbatches of ``batch`` (a scan when k > 1)."""
    if k == 1:
        return grad_one(batch, step_key)
    shared = {n: v for n, v in batch.items() if jnp.ndim(v) == 0}
    mbs = _split_microbatches({n: v for n, v in batch.items() if n not in shared}, k)
    first = {**jax.tree.map(lambda x: x[0], mbs), **shared}
    shapes = jax.eval_shape(grad_one, first, step_key)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(carry, xs):
        mb, i = xs
        out = grad_one({**mb, **shared}, jax.random.fold_in(step_key, i))
        return jax.tree.map(jnp.add, carry, out), None

    summed, _ = jax.lax.scan(body, zeros, (mbs, jnp.arange(k)))
    return summed


def _apply_update(
    optimizer: optax.GradientTransformation,
    decay: float | None,
    state: TrainState,
    grads: Any,
    ok: jax.Array,
    rng: jax.Array,
) -> TrainState:
    """The next state: the optimizer's update and the EMA, kept only where ``ok``."""
    params = state.params["params"]
    updates, new_opt = optimizer.update(grads, state.opt_state, params)
    new_params = optax.apply_updates(params, updates)

    def keep(new: Any, old: Any) -> Any:
        return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)

    variables = {**state.params, "params": keep(new_params, params)}
    opt_state = keep(new_opt, state.opt_state)
    ema = state.ema
    if decay is not None and decay < 1.0:
        moved = jax.tree.map(
            lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype), ema, variables
        )
        ema = keep(moved, ema)
    return TrainState(
        step=state.step + 1,
        updates=state.updates + ok.astype(state.updates.dtype),
        params=variables,
        opt_state=opt_state,
        ema=ema,
        rng=rng,
    )


def _step_metrics(
    ls: jax.Array, loss: jax.Array, w: jax.Array, safe: jax.Array, grads: Any, msum: Metrics
) -> Metrics:
    """The step's loss, weight, gradient norm, and each metric divided by the total weight."""
    metrics = {"loss": jnp.where(jnp.isfinite(ls), loss, ls), "weight": w}
    metrics["grad_norm"] = optax.tree.norm(grads)
    for name, v in msum.items():
        out_name = name[: -len("_sum")] if name.endswith("_sum") else name
        metrics[out_name] = v / safe
    return metrics


def reference_selector(objective: Objective) -> Callable[[Any], Any]:
    """What ``TrainState.ema`` keeps: the whole variables, or, for a frozen reference
    (``ema_decay == 1.0``) of an objective with ``reference_variables(variables)``, only that
    part (PPO keeps the policy, not the critic). A moving average needs the whole tree."""
    select = getattr(objective, "reference_variables", None)
    if select is None:
        return lambda variables: variables
    if objective.ema_decay not in (None, 1.0):
        raise ValueError(
            f"objective.reference_variables: a partial reference needs ema_decay 1.0 (frozen) or "
            f"None, got {objective.ema_decay!r}"
        )
    return select


def make_init(
    objective: Objective, optimizer: optax.GradientTransformation
) -> Callable[[Any, jax.Array], TrainState]:
    """``(variables, rng) -> TrainState``: optimizer state and EMA for given variables."""
    decay = objective.ema_decay
    reference_of = reference_selector(objective)

    def init(variables: Any, rng: jax.Array) -> TrainState:
        if not isinstance(variables, dict) or "params" not in variables:
            raise ValueError(
                "objective.init: expected a variables mapping with a 'params' collection, "
                f"got {type(variables).__name__} with keys {list(getattr(variables, 'keys', list)())}"
            )
        variables = dict(variables)
        ema = None if decay is None else jax.tree.map(jnp.array, reference_of(variables))
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            updates=jnp.zeros((), jnp.int32),
            params=variables,
            opt_state=optimizer.init(variables["params"]),
            ema=ema,
            rng=rng,
        )

    return init

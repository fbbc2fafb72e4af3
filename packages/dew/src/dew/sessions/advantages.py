"""Group-relative advantages of session rewards, ragged groups allowed (host side).

The arithmetic is the advantage estimator ``estimator`` names in ``dew.rl``'s registry (the
built-ins ``"group"``, ``"mean"`` and ``"rloo"`` are ``dew.rl.ragged_group_advantage``, the
one implementation of the group baselines; ``dew.rl.register_advantage_estimator`` adds
others); this module only turns ``pack``'s hashable group keys into integer ids.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dew.rl as rl
from dew.sessions.records import check_choice

#: The estimator names registered when this module was imported (the built-ins). The checks
#: ask the registry itself (:func:`check_estimator`), which also knows later registrations.
ESTIMATORS = rl.registered("estimator")
GROUP_EPSILON = 1e-6


def check_estimator(estimator: str) -> None:
    """Raise a ValueError naming ``estimator`` unless ``dew.rl``'s registry knows the name."""
    check_choice(estimator, rl.registered("estimator"), "estimator")


def group_advantages(
    rewards: Sequence[float], keys: Sequence[Hashable], estimator: str
) -> np.ndarray:
    """Advantages of ``[S]`` rewards grouped by ``keys`` (ragged groups allowed), float64.

    verl 0.9.1's rules (``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage``)
    through ``dew.rl.ragged_group_advantage``: a group of one keeps its reward (baseline 0,
    deviation 1); ``"group"`` divides by the unbiased deviation plus 1e-6, so a group of equal
    rewards gets zero advantages. Keys are numbered in order of appearance. The rewards are
    padded to a power of two (the padding masked out) so that a few compiled shapes serve
    every batch, and the arithmetic runs in float64 on the CPU.
    """
    check_estimator(estimator)
    values = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if values.size != len(keys):
        raise ValueError(f"keys: expected one key per reward ({values.size}), got {len(keys)}")
    number: dict[Hashable, int] = {}
    ids = [number.setdefault(key, len(number)) for key in keys]
    size = max(8, 1 << (values.size - 1).bit_length())
    padded = np.zeros(size, np.float64)
    padded[: values.size] = values
    group_ids = np.zeros(size, np.int32)
    group_ids[: values.size] = ids
    kept = np.arange(size) < values.size
    out = on_host_x64(_jitted_estimator(estimator), padded, group_ids, kept)
    return out[: values.size]


@functools.cache
def _jitted_estimator(estimator: str) -> Callable[..., jax.Array]:
    """The registered estimator under ``jax.jit``, with ``eps`` fixed; one per name (a name
    cannot be registered twice, so the cache cannot go stale)."""
    return jax.jit(functools.partial(rl.get_advantage_estimator(estimator), eps=GROUP_EPSILON))


def on_host_x64(function: Callable[..., jax.Array], *arrays: Any, **static: Any) -> np.ndarray:
    """``function(*arrays, **static)`` on this process's CPU device with x64 on, as numpy.

    Advantages are host work done once per batch: running them on the CPU in float64 keeps
    them off the accelerator and exact to the reference's double precision, whatever
    precision the rest of the program computes in. x64 is switched on for the call only.
    ``arrays`` are converted with ``jnp.asarray`` (float64 stays float64); ``static`` is
    passed as is, for a jitted ``function``'s static arguments. The device is a *local* CPU
    device: with several processes, ``jax.devices("cpu")[0]`` may belong to another one.
    Without a CPU backend, JAX's default device is used.
    """
    try:
        device: jax.Device | None = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        device = None
    with jax.enable_x64(True), jax.default_device(device):
        return np.asarray(function(*(jnp.asarray(a) for a in arrays), **static))


__all__ = ["ESTIMATORS", "GROUP_EPSILON", "check_estimator", "group_advantages", "on_host_x64"]

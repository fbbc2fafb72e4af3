"""Group-relative advantages of session rewards, ragged groups allowed (host side).

The arithmetic is ``dew.rl.ragged_group_advantage``, the one implementation of the group
baselines; this module only turns ``pack``'s hashable group keys into integer ids.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import dew.rl as rl
from dew.sessions.records import check_choice

ESTIMATORS = ("group", "mean", "rloo")
GROUP_EPSILON = 1e-6


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
    check_choice(estimator, ESTIMATORS, "estimator")
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
    with jax.enable_x64(True), jax.default_device(_host_device()):
        out = _ragged_advantage(
            jnp.asarray(padded), jnp.asarray(group_ids), jnp.asarray(kept), estimator=estimator
        )
        return np.asarray(out)[: values.size]


_ragged_advantage = jax.jit(
    functools.partial(rl.ragged_group_advantage, eps=GROUP_EPSILON), static_argnames="estimator"
)


def _host_device() -> jax.Device | None:
    """This process's CPU device when JAX has one (packing is host work), else JAX's default.
    A local device: with several processes, ``jax.devices("cpu")[0]`` may belong to another."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return None


__all__ = ["ESTIMATORS", "GROUP_EPSILON", "group_advantages"]

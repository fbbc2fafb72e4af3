"""Sampling a whole trajectory with its transition densities: ``sample_trajectory``.

The sampler walks ``steps`` time points from 1 to 0 (``K = steps - 1`` transitions). Each
transition with a positive noise scale is one Gaussian SDE step of Flow-GRPO; its joint log
density (summed over every coordinate of the state) is recorded, and the transition is marked
as having stochastic support. A transition with zero scale is an Euler step: it has no density,
its entry is 0 and its mark is False, so a policy loss never reads it.

Everything is a pure function of its inputs: the initial noise and the per-step noise are
arguments (:func:`row_noise` draws them from one key per row, so a row's trajectory does not
depend on which other rows share its batch or process).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

from dew.flow.process import Process, coordinate_log_density

Velocity = Callable[[jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class FlowTrajectory:
    """One sampled trajectory per row.

    Fields:
      states: ``[B, K + 1, ...]`` the states at every time point (``states[:, 0]`` is the
        initial noise, ``states[:, -1]`` the sample).
      times: ``[K + 1]`` the time grid, from 1 down to 0.
      log_densities: ``[B, K]`` joint log density of each transition (0 where deterministic).
      stochastic: ``[K]`` bool, True where the transition has Gaussian support.
      scales: ``[K]`` the SDE noise scale ``s`` of each transition.
      stds: ``[K]`` the transition standard deviation ``s sqrt(t - t')``.
      means: ``[B, K, ...]`` the transition means (the Euler step where deterministic).
    """

    states: jax.Array
    times: jax.Array
    log_densities: jax.Array
    stochastic: jax.Array
    scales: jax.Array
    stds: jax.Array
    means: jax.Array

    @property
    def samples(self) -> jax.Array:
        """``[B, ...]`` the final states (time 0)."""
        return self.states[:, -1]

    @property
    def coordinate_log_densities(self) -> jax.Array:
        """``[B, K]`` per-coordinate log densities (joint divided by the coordinate count)."""
        size = 1
        for d in self.states.shape[2:]:
            size *= int(d)
        return self.log_densities / size


def row_noise(keys: jax.Array, shape: tuple[int, ...], steps: int) -> tuple[jax.Array, jax.Array]:
    """``(initial [B, *shape], noise [B, steps - 1, *shape])`` standard normals, one key a row."""

    def one(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        first, rest = jax.random.split(key)
        return (
            jax.random.normal(first, shape, jnp.float32),
            jax.random.normal(rest, (steps - 1, *shape), jnp.float32),
        )

    return jax.vmap(one)(keys)


def sample_trajectory(
    velocity: Velocity,
    process: Process,
    initial: jax.Array,
    steps: int,
    noise: jax.Array | None = None,
) -> FlowTrajectory:
    """Run the sampler from ``initial`` ``[B, ...]`` (the noise at time 1) to time 0.

    Args:
      velocity: ``(x [B, ...], t [B]) -> v [B, ...]``, the model's velocity.
      process: the ``Process`` (time grid, noise scales, SDE step).
      initial: ``[B, ...]`` states at time 1.
      steps: time points including both ends (``K = steps - 1`` transitions).
      noise: ``[B, K, ...]`` standard normals for the stochastic transitions; ``None`` runs
        the deterministic Euler sampler (every mark False, every density 0).

    Returns:
      a :class:`FlowTrajectory`.
    """
    times = process.grid(steps)
    k = steps - 1
    b = initial.shape[0]
    if noise is None:
        scales = jnp.zeros((k,), jnp.float32)
        noise = jnp.zeros((b, k, *initial.shape[1:]), jnp.float32)
    else:
        scales = process.noise_scales(times)
        if noise.shape != (b, k, *initial.shape[1:]):
            raise ValueError(
                f"noise: expected shape [B, steps - 1, ...] = {[b, k, *initial.shape[1:]]}, got "
                f"{list(noise.shape)}"
            )
    size = 1
    for d in initial.shape[1:]:
        size *= int(d)

    def body(
        x: jax.Array, inputs: tuple[jax.Array, ...]
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        t, t_next, scale, eps = inputs
        tb = jnp.full((b,), t, jnp.float32)
        v = velocity(x, tb)
        mean, std = process.sde_step(x, v, tb, jnp.full((b,), t_next), jnp.full((b,), scale))
        x_next = mean + std.reshape((b,) + (1,) * (x.ndim - 1)) * eps
        density = coordinate_log_density(x_next, mean, std) * size
        return x_next, (x_next, density, mean, std[0])

    xs = (times[:-1], times[1:], scales, jnp.swapaxes(noise, 0, 1))
    _, (states, densities, means, stds) = jax.lax.scan(body, initial.astype(jnp.float32), xs)
    states = jnp.concatenate([initial[None].astype(jnp.float32), states], axis=0)
    return FlowTrajectory(
        states=jnp.swapaxes(states, 0, 1),
        times=times,
        log_densities=jnp.swapaxes(densities, 0, 1),
        stochastic=stds > 0,
        scales=scales,
        stds=stds,
        means=jnp.swapaxes(means, 0, 1),
    )


__all__ = ["FlowTrajectory", "Velocity", "row_noise", "sample_trajectory"]

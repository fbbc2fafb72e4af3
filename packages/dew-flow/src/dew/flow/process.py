"""The rectified-flow process: interpolation, its flow-matching loss and its two samplers.

Time runs from ``t = 0`` (data) to ``t = 1`` (Gaussian noise) along straight lines,
``x_t = (1 - t) x_0 + t eps`` (Liu et al. 2022; the convention of Stable Diffusion 3,
Esser et al. 2024). The model predicts the velocity ``v = dx_t/dt = eps - x_0``; training
regresses it with a squared error at times drawn from a logit-normal (or uniform) sampler.

Sampling walks a time grid from 1 down to 0 (``steps`` points, both ends included, optionally
warped by ``shift``):

- the ODE (Euler) step ``x' = x + v (t' - t)``;
- the SDE step of Flow-GRPO (Liu et al. 2025, arXiv 2505.05470, section 4; released code
  ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``, commit ``ac4c86e``): with
  ``s = a sqrt(t / (1 - t))`` (``a`` the noise level) and ``dt = t' - t < 0``, the transition
  is Gaussian with mean ``x (1 + s^2 dt / (2t)) + v (1 + s^2 (1 - t) / (2t)) dt`` and standard
  deviation ``s sqrt(-dt)`` in every coordinate. At ``t = 1`` the ratio would divide by zero;
  the released code, followed here, puts the grid's second time in the denominator instead.

A transition with zero noise scale (noise level 0, or outside ``sde_window``) is the Euler
step: deterministic, without a density.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
TIME_SAMPLERS = ("logit-normal", "uniform")


@dataclass(frozen=True)
class Process:
    """Rectified flow with velocity prediction.

    Args:
      time_sampler: ``"logit-normal"`` (``t = sigmoid(loc + scale z)``, Esser et al. 2024) or
        ``"uniform"`` training times.
      loc: location of the logit-normal sampler.
      scale: scale of the logit-normal sampler.
      shift: time-grid warp ``shift t / (1 + (shift - 1) t)`` used by the samplers (1: none;
        Stable Diffusion 3 uses 3).
      noise_level: the SDE sampler's ``a`` (Flow-GRPO's ``noise_level``, default 0.7).
      sde_window: ``(start, stop)``: only transitions ``start <= k < stop`` are stochastic,
        the rest take Euler steps; ``None``: every transition with ``t > 0`` is stochastic.
    """

    time_sampler: str = "logit-normal"
    loc: float = 0.0
    scale: float = 1.0
    shift: float = 1.0
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.time_sampler not in TIME_SAMPLERS:
            raise ValueError(
                f"Process.time_sampler: expected one of {TIME_SAMPLERS}, got {self.time_sampler!r}"
            )
        if not (float(self.scale) > 0 and math.isfinite(float(self.scale))):
            raise ValueError(f"Process.scale: expected a positive finite value, got {self.scale!r}")
        if not (float(self.shift) > 0 and math.isfinite(float(self.shift))):
            raise ValueError(f"Process.shift: expected a positive finite value, got {self.shift!r}")
        if not (float(self.noise_level) >= 0 and math.isfinite(float(self.noise_level))):
            raise ValueError(
                f"Process.noise_level: expected a finite value >= 0, got {self.noise_level!r}"
            )
        if self.sde_window is not None:
            start, stop = (int(v) for v in self.sde_window)
            if not 0 <= start < stop:
                raise ValueError(
                    f"Process.sde_window: expected (start, stop) with 0 <= start < stop, got "
                    f"{self.sde_window!r}"
                )
            object.__setattr__(self, "sde_window", (start, stop))

    # ------------------------------------------------------------------ training
    def interpolate(self, x0: jax.Array, noise: jax.Array, t: jax.Array) -> jax.Array:
        """``x_t = (1 - t) x_0 + t eps``; ``x0``, ``noise`` ``[B, ...]``, ``t`` ``[B]``."""
        tb = t.reshape(t.shape + (1,) * (x0.ndim - 1)).astype(x0.dtype)
        return (1.0 - tb) * x0 + tb * noise

    def velocity_target(self, x0: jax.Array, noise: jax.Array) -> jax.Array:
        """The regression target ``eps - x_0`` ``[B, ...]``."""
        return noise - x0

    def sample_times(self, key: jax.Array, rows: int) -> jax.Array:
        """``[rows]`` training times in ``(0, 1)``."""
        if self.time_sampler == "uniform":
            return jax.random.uniform(key, (rows,), jnp.float32)
        z = jax.random.normal(key, (rows,), jnp.float32)
        return jax.nn.sigmoid(self.loc + self.scale * z)

    def loss(self, velocity: jax.Array, x0: jax.Array, noise: jax.Array) -> jax.Array:
        """``[B]`` flow-matching loss: the mean squared velocity error of each row."""
        err = jnp.square(velocity.astype(jnp.float32) - self.velocity_target(x0, noise))
        return jnp.mean(err.reshape(err.shape[0], -1), axis=1)

    # ------------------------------------------------------------------ sampling
    def grid(self, steps: int) -> jax.Array:
        """``[steps]`` times from 1 down to 0 (both included), warped by ``shift``."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise ValueError(f"steps: expected an integer >= 2 (both endpoints), got {steps!r}")
        s = jnp.linspace(1.0, 0.0, steps, dtype=jnp.float32)
        return self.shift * s / (1.0 + (self.shift - 1.0) * s)

    def noise_scales(self, times: jax.Array) -> jax.Array:
        """``[K]`` SDE noise scales ``s`` of the ``K = steps - 1`` transitions of ``times``.

        Zero for deterministic transitions: ``t = 0``, a noise level of 0 or outside
        ``sde_window``.
        """
        t = times[:-1]
        top = times[1] if times.shape[0] > 1 else times[0]
        denominator = 1.0 - jnp.where(t == 1.0, top, t)
        ratio = jnp.where(t > 0, t / jnp.where(denominator > 0, denominator, 1.0), 0.0)
        scales = self.noise_level * jnp.sqrt(ratio)
        if self.sde_window is not None:
            k = jnp.arange(t.shape[0])
            inside = (k >= self.sde_window[0]) & (k < self.sde_window[1])
            scales = jnp.where(inside, scales, 0.0)
        return scales.astype(jnp.float32)

    def euler_step(self, x: jax.Array, v: jax.Array, t: jax.Array, t_next: jax.Array) -> jax.Array:
        """The ODE step ``x + v (t' - t)``; ``t``, ``t_next`` are ``[B]`` or scalars."""
        dt = _rows(t_next - t, x)
        return x + v.astype(x.dtype) * dt

    def sde_step(
        self, x: jax.Array, v: jax.Array, t: jax.Array, t_next: jax.Array, scale: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Flow-GRPO's transition ``(mean [B, ...], std [B])`` from ``x`` at ``t`` to ``t_next``.

        ``scale`` is the noise scale ``s`` of the transition (:meth:`noise_scales`). With
        ``scale = 0`` the mean is the Euler step and the std is 0.
        """
        x = x.astype(jnp.float32)
        v = v.astype(jnp.float32)
        t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), x.shape[:1])
        t_next = jnp.broadcast_to(jnp.asarray(t_next, jnp.float32), x.shape[:1])
        scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float32), x.shape[:1])
        dt = t_next - t
        safe_t = jnp.where(t > 0, t, 1.0)
        s2 = jnp.square(scale)
        x_coef = 1.0 + s2 / (2.0 * safe_t) * dt
        v_coef = (1.0 + s2 * (1.0 - t) / (2.0 * safe_t)) * dt
        mean = x * _rows(x_coef, x) + v * _rows(v_coef, x)
        std = scale * jnp.sqrt(jnp.maximum(-dt, 0.0))
        return mean, std


def _rows(values: jax.Array, like: jax.Array) -> jax.Array:
    """Broadcast ``[B]`` (or a scalar) over the trailing axes of ``like``."""
    values = jnp.asarray(values, like.dtype)
    if values.ndim == 0:
        return values
    return values.reshape(values.shape + (1,) * (like.ndim - values.ndim))


def coordinate_log_density(x_next: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """``[B]`` log density of ``x_next`` per coordinate (the mean over coordinates).

    Each coordinate is ``N(mean, std^2)`` with ``std`` ``[B]``; rows with ``std = 0`` (a
    deterministic step) get 0. Multiply by the number of coordinates for the joint density.
    The sample is treated as data (no gradient flows into ``x_next``), as Flow-GRPO detaches it.
    """
    x_next = jax.lax.stop_gradient(x_next.astype(jnp.float32))
    live = std > 0
    safe = jnp.where(live, std, 1.0)
    z = (x_next - mean) / _rows(safe, mean)
    per = -0.5 * jnp.square(z) - _rows(jnp.log(safe), mean) - LOG_SQRT_2PI
    value = jnp.mean(per.reshape(per.shape[0], -1), axis=1)
    return jnp.where(live, value, 0.0)


def transition_kl(mean: jax.Array, ref_mean: jax.Array, std: jax.Array) -> jax.Array:
    """``[B]`` per-coordinate KL between two SDE transitions of the same state and time.

    Both transitions are ``N(mean, std^2 I)`` and ``N(ref_mean, std^2 I)``, with ``std`` the
    transition's standard deviation ``s sqrt(t - t')`` ``[B]`` (the elapsed time is in the
    variance). Their KL per coordinate is ``mean((mean - ref_mean)^2) / (2 std^2)``. Rows with
    ``std = 0`` get 0. Flow-GRPO's released trainer divides by ``2 s^2`` instead (without the
    elapsed time), so its beta is on another scale.
    """
    live = std > 0
    safe = jnp.where(live, std, 1.0)
    diff = (mean - ref_mean).astype(jnp.float32)
    sq = jnp.mean(jnp.square(diff).reshape(diff.shape[0], -1), axis=1)
    return jnp.where(live, sq / (2.0 * jnp.square(safe)), 0.0)


__all__ = ["LOG_SQRT_2PI", "TIME_SAMPLERS", "Process", "coordinate_log_density", "transition_kl"]

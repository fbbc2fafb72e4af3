"""The math of absorbing-state (masked) discrete diffusion, as pure functions of arrays.

Reference: Sahoo et al. 2024, "Simple and Effective Masked Diffusion Language Models"
(MDLM), github.com/kuleshov-group/mdlm (``noise_schedule.py``, ``diffusion.py``). The
forward process replaces each token independently by a mask id with probability
``1 - exp(-sigma(t))`` at time ``t`` in ``(0, 1]``; the continuous-time ELBO weighs the
negative log-likelihood of the true token at each masked position by
``sigma'(t) / expm1(sigma(t))`` (``1 / t`` under the log-linear schedule).

- ``Schedule`` with ``LogLinearSchedule`` and ``CosineSchedule``: ``sigma(t)`` and
  ``sigma'(t)`` (MDLM's ``total_noise`` and ``rate_noise``), the mask probability and the
  ELBO weight.
- ``sample_times(key, n, eps)``: MDLM's antithetic (stratified) draw of ``n`` times.
- ``mask_tokens(key, tokens, move_chance, mask_id, real)``: the forward process.
- ``subs_log_probs``: the SUBS parameterisation as a full ``[B, T, V]`` log-probability
  array (tests and inspection; the loss does not build it).
- ``diffusion_nll``: per-token loss ``[B, T]`` from logits, clean tokens, which positions
  are masked and the times: what the objective sums, and what the parity test checks.

Everything runs in float32. ``tokens`` never hold the mask id; ``masked`` positions are the
ones the model saw as the mask id.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

# MDLM adds this to the mask id's logit (its ``neg_infinity``): after the log-softmax the
# mask id keeps a log-probability of about -1e6, zero in probability in float32.
MASK_LOGIT_OFFSET = -1_000_000.0


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A noise schedule: total noise ``sigma(t)`` and its rate ``sigma'(t)`` for ``t`` in [0, 1].

    eps: how much of the sequence stays unmasked at ``t = 1`` (MDLM's default 1e-3), which
    keeps ``sigma(1)`` finite.
    """

    eps: float = 1e-3

    def sigma(self, t: jax.Array) -> jax.Array:
        raise NotImplementedError

    def rate(self, t: jax.Array) -> jax.Array:
        raise NotImplementedError

    def move_chance(self, t: jax.Array) -> jax.Array:
        """Probability that a token is masked at time ``t``: ``1 - exp(-sigma(t))``."""
        return -jnp.expm1(-self.sigma(t))

    def weight(self, t: jax.Array) -> jax.Array:
        """The ELBO weight of a masked token's NLL: ``sigma'(t) / expm1(sigma(t))``.

        Infinite at ``t = 0`` (nothing is masked there); ``sample_times`` keeps ``t >= eps``.
        """
        return self.rate(t) / jnp.expm1(self.sigma(t))


@dataclasses.dataclass(frozen=True)
class LogLinearSchedule(Schedule):
    """``sigma(t) = -log(1 - (1 - eps) t)``: the mask probability ``(1 - eps) t`` is linear.

    The ELBO weight is then exactly ``1 / t`` (MDLM's ``LogLinearNoise``).
    """

    def sigma(self, t: jax.Array) -> jax.Array:
        return -jnp.log1p(-(1.0 - self.eps) * t)

    def rate(self, t: jax.Array) -> jax.Array:
        return (1.0 - self.eps) / (1.0 - (1.0 - self.eps) * t)


@dataclasses.dataclass(frozen=True)
class CosineSchedule(Schedule):
    """``sigma(t) = -log(eps + (1 - eps) cos(pi t / 2))`` (MDLM's ``CosineNoise``)."""

    def sigma(self, t: jax.Array) -> jax.Array:
        return -jnp.log(self.eps + (1.0 - self.eps) * jnp.cos(t * math.pi / 2))

    def rate(self, t: jax.Array) -> jax.Array:
        cos = (1.0 - self.eps) * jnp.cos(t * math.pi / 2)
        sin = (1.0 - self.eps) * jnp.sin(t * math.pi / 2)
        return (math.pi / 2) * sin / (cos + self.eps)


SCHEDULES: dict[str, type[Schedule]] = {"loglinear": LogLinearSchedule, "cosine": CosineSchedule}


def schedule_named(name: str | Schedule, eps: float = 1e-3) -> Schedule:
    """A schedule given by name (``"loglinear"`` or ``"cosine"``) or passed through."""
    if isinstance(name, Schedule):
        return name
    if name not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {sorted(SCHEDULES)}, got {name!r}")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"schedule eps: expected a float in (0, 1), got {eps!r}")
    return SCHEDULES[name](eps=float(eps))


def sample_times(key: jax.Array, n: int, eps: float = 1e-3, antithetic: bool = True) -> jax.Array:
    """``n`` float32 times in ``[eps, 1)`` (MDLM's ``_sample_t``).

    Antithetic: row ``i`` draws ``u_i`` uniform and takes ``(u_i / n + i / n) mod 1``, one
    time in each of ``n`` equal strata, which lowers the variance of the batch's loss. Then
    ``t = (1 - eps) u + eps``, so no row sits at ``t = 0`` where the weight is infinite.
    """
    u = jax.random.uniform(key, (n,), jnp.float32)
    if antithetic:
        u = jnp.mod(u / n + jnp.arange(n, dtype=jnp.float32) / n, 1.0)
    return (1.0 - eps) * u + eps


def mask_tokens(
    key: jax.Array, tokens: jax.Array, move_chance: jax.Array, mask_id: int, real: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The forward process: ``(noisy ids [B, T], masked bool [B, T])``.

    tokens int ``[B, T]``; move_chance ``[B]``, each row's mask probability; real bool
    ``[B, T]``, the positions that may be masked (padding stays as it is). A position is
    masked when a uniform draw falls below its row's chance (MDLM's ``q_xt``).
    """
    draws = jax.random.uniform(key, tokens.shape, jnp.float32)
    masked = (draws < move_chance[:, None]) & real
    return jnp.where(masked, mask_id, tokens), masked


def subs_log_probs(logits: jax.Array, noisy: jax.Array, mask_id: int) -> jax.Array:
    """SUBS: float32 log-probabilities ``[B, T, V]`` over the clean token at each position.

    The mask id gets ``MASK_LOGIT_OFFSET`` added before the log-softmax, so it is never
    predicted; at a position whose noisy id is not the mask, the model's output is replaced
    by a one-hot on that id (log-probability 0 there, ``MASK_LOGIT_OFFSET`` elsewhere):
    unmasked tokens are carried over. Builds a ``[B, T, V]`` array; ``diffusion_nll`` does not.
    """
    logits = logits.astype(jnp.float32)
    logits = logits.at[..., mask_id].add(MASK_LOGIT_OFFSET)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    vocab = jnp.arange(logits.shape[-1])
    carried = jnp.where(vocab == noisy[..., None], 0.0, MASK_LOGIT_OFFSET)
    return jnp.where((noisy != mask_id)[..., None], carried, log_probs)


def diffusion_nll(
    logits: jax.Array,
    tokens: jax.Array,
    masked: jax.Array,
    times: jax.Array,
    mask_id: int,
    schedule: Schedule,
) -> jax.Array:
    """MDLM's continuous-time loss per position, float32 ``[B, T]``.

    logits ``[B, T, V]`` (the model's output on the noisy ids), tokens int ``[B, T]`` (the
    clean ids), masked bool ``[B, T]``, times ``[B]``. At a masked position the loss is
    ``weight(t) * -log p(token)`` with ``p`` the SUBS distribution (softmax without the mask
    id); elsewhere it is 0, as SUBS gives log-probability 0 to a carried-over token. The sum
    over a row's real tokens divided by their count is the row's NLL bound in nats per token.
    Equal to gathering ``subs_log_probs`` at the tokens, without the ``[B, T, V]`` copy.
    """
    logits = logits.astype(jnp.float32)
    shifted = logits.at[..., mask_id].add(MASK_LOGIT_OFFSET)
    picked = jnp.take_along_axis(shifted, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    nll = jax.nn.logsumexp(shifted, axis=-1) - picked
    weight = schedule.weight(times.astype(jnp.float32))
    return jnp.where(masked, nll * weight[:, None], 0.0)


__all__ = [
    "MASK_LOGIT_OFFSET",
    "SCHEDULES",
    "CosineSchedule",
    "LogLinearSchedule",
    "Schedule",
    "diffusion_nll",
    "mask_tokens",
    "sample_times",
    "schedule_named",
    "subs_log_probs",
]

"""DiffusionObjective: flow matching on data, trained by the ordinary ``dew.Trainer``.

Each (micro)batch holds the target images (``InputSpec.target``, ``[B, H, W, C]``) and the
condition fields. The loss draws one time and one noise per row, forms ``x_t``, and regresses
the model's velocity on ``eps - x_0`` (``Process.loss``); with an ``autoencoder`` the flow runs
on ``autoencoder.encode(x_0)`` instead of pixels. ``loss`` returns the sum of the rows' losses
and the row count, so microbatching and data parallelism give the mean over the global batch.

:class:`FlowModel` is the part shared with ``FlowGRPOObjective``: the ``Denoiser`` (model and
encoders), variable initialisation, guided velocity, the latent space and generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from dew.flow.inputs import InputSpec, to_unit
from dew.flow.models import Denoiser
from dew.flow.process import Process
from dew.flow.trajectory import FlowTrajectory, row_noise, sample_trajectory
from dew.objectives.base import validate_ema_decay, validate_pretrained


class Autoencoder(Protocol):
    """A frozen map between pixels ``[B, H, W, C]`` in ``[-1, 1]`` and latents (jit-safe)."""

    def encode(self, images: jax.Array) -> jax.Array: ...

    def decode(self, latents: jax.Array) -> jax.Array: ...


class FlowModel:
    """Model, encoders, process, inputs and autoencoder of a flow objective."""

    def __init__(
        self,
        model: Any,
        process: Process,
        inputs: InputSpec,
        encoders: Mapping[str, Any] | None = None,
        autoencoder: Autoencoder | None = None,
        pretrained: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(process, Process):
            raise TypeError(
                f"process: expected a dew.flow.Process (presets.Flow()()), got {type(process).__name__}"
            )
        if not isinstance(inputs, InputSpec):
            raise TypeError(f"inputs: expected a dew.flow.InputSpec, got {type(inputs).__name__}")
        encoders = dict(encoders or {})
        names = [f.name for f in inputs.conditions]
        for name in encoders:
            if name not in names:
                raise ValueError(
                    f"encoders[{name!r}]: not a condition field of inputs (conditions: {names})"
                )
        for name in ("encode", "decode"):
            if autoencoder is not None and not callable(getattr(autoencoder, name, None)):
                raise TypeError(f"autoencoder: expected encode() and decode(), it has no {name}()")
        self.model = model
        self.process = process
        self.inputs = inputs
        self.encoders = encoders
        self.autoencoder = autoencoder
        self.pretrained = validate_pretrained(pretrained)
        self.denoiser = Denoiser(model, tuple(encoders), tuple(encoders.values()))
        image = jnp.zeros((1, *inputs.target_field.shape), jnp.float32)
        self.state_shape: tuple[int, ...] = tuple(jax.eval_shape(self.to_latent, image).shape[1:])

    # ------------------------------------------------------------------ spaces
    def to_latent(self, images: jax.Array) -> jax.Array:
        """Pixels (``uint8`` or ``[-1, 1]``) to the space the flow runs in."""
        x = to_unit(images)
        return x if self.autoencoder is None else self.autoencoder.encode(x).astype(jnp.float32)

    def to_pixels(self, latents: jax.Array) -> jax.Array:
        """Flow states back to pixels in ``[-1, 1]`` (clipped)."""
        x = latents if self.autoencoder is None else self.autoencoder.decode(latents)
        return jnp.clip(x.astype(jnp.float32), -1.0, 1.0)

    # ------------------------------------------------------------------ model
    def init(self, key: jax.Array) -> dict[str, Any]:
        """``pretrained`` when given, else fresh variables of the model and its encoders."""
        if self.pretrained is not None:
            return dict(self.pretrained)
        x = jnp.zeros((1, *self.state_shape), jnp.float32)
        fields = {
            f.name: jnp.zeros((1, *f.shape), f.dtype)
            for f in self.inputs.conditions
            if f.name in self.encoders
        }
        return dict(self.denoiser.init(key, x, jnp.zeros((1,), jnp.float32), fields))

    def fields(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The encoders' inputs taken from ``batch``."""
        return {name: batch[name] for name in self.encoders}

    def velocity(
        self,
        variables: Mapping[str, Any],
        x: jax.Array,
        t: jax.Array,
        fields: Mapping[str, Any],
        guidance: float | None = None,
        detach_unconditional: bool = False,
    ) -> jax.Array:
        """``[B, ...]`` velocity; with ``guidance`` ``g``: ``u + g (c - u)`` (classifier-free)."""
        cond: Any = self.denoiser.apply(variables, x, t, dict(fields))
        if guidance is None or not self.encoders:
            return cond.astype(jnp.float32)
        drop = jnp.ones((x.shape[0],), bool)
        uncond: Any = self.denoiser.apply(variables, x, t, dict(fields), drop)
        if detach_unconditional:
            uncond = jax.lax.stop_gradient(uncond)
        return (uncond + guidance * (cond - uncond)).astype(jnp.float32)

    def trajectory(
        self,
        variables: Mapping[str, Any],
        fields: Mapping[str, Any],
        keys: jax.Array,
        steps: int,
        guidance: float | None = None,
        stochastic: bool = True,
    ) -> FlowTrajectory:
        """Sample one trajectory per row from per-row ``keys`` ``[B]`` (jit-safe)."""
        initial, noise = row_noise(keys, self.state_shape, steps)

        def velocity(x: jax.Array, t: jax.Array) -> jax.Array:
            return self.velocity(variables, x, t, fields, guidance)

        return sample_trajectory(
            velocity, self.process, initial, steps, noise if stochastic else None
        )

    def generate(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, Any],
        key: jax.Array,
        steps: int,
        guidance: float | None = None,
        stochastic: bool = False,
    ) -> jax.Array:
        """``[B, H, W, C]`` images in ``[-1, 1]`` for the rows of ``batch`` (ODE by default)."""
        rows = self.inputs.rows(batch)
        keys = jax.random.split(key, rows)
        path = self.trajectory(variables, self.fields(batch), keys, steps, guidance, stochastic)
        return self.to_pixels(path.samples)


class DiffusionObjective(FlowModel):
    """Flow matching of ``model`` on the target images of each batch.

    Args:
      model: a flax module ``(x [B, H, W, C], t [B], condition [B, D] | None) -> velocity``,
        e.g. ``SimpleDiT``.
      process: the ``Process`` (``presets.Flow()()``).
      inputs: the ``InputSpec`` of the batches.
      encoders: ``{condition field: flax module -> [B, D]}``; their outputs are summed into
        the model's condition and trained with it.
      autoencoder: optional frozen ``encode``/``decode`` pair; the flow then runs on latents.
      pretrained: full variables mapping to start from.
      condition_dropout: share of rows whose condition is zeroed during training, which
        teaches the unconditional velocity that classifier-free guidance needs.
      ema_decay: ``None`` (default) or an EMA decay kept by the Trainer.
    """

    def __init__(
        self,
        model: Any,
        process: Process,
        inputs: InputSpec,
        encoders: Mapping[str, Any] | None = None,
        autoencoder: Autoencoder | None = None,
        pretrained: Mapping[str, Any] | None = None,
        condition_dropout: float = 0.0,
        ema_decay: float | None = None,
    ) -> None:
        super().__init__(model, process, inputs, encoders, autoencoder, pretrained)
        if not 0.0 <= float(condition_dropout) < 1.0:
            raise ValueError(
                f"condition_dropout: expected a share in [0, 1), got {condition_dropout!r}"
            )
        self.condition_dropout = float(condition_dropout)
        self.ema_decay = validate_ema_decay(ema_decay)

    def _row_losses(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array, train: bool
    ) -> jax.Array:
        self.inputs.check(batch, target=True)
        x0 = self.to_latent(batch[self.inputs.target])
        rows = x0.shape[0]
        k_time, k_noise, k_drop = jax.random.split(key, 3)
        t = self.process.sample_times(k_time, rows)
        noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
        xt = self.process.interpolate(x0, noise, t)
        drop = None
        if train and self.condition_dropout > 0 and self.encoders:
            drop = jax.random.uniform(k_drop, (rows,)) < self.condition_dropout
        v: Any = self.denoiser.apply(variables, xt, t, self.fields(batch), drop)
        return self.process.loss(v, x0, noise)

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, Any],
        key: jax.Array,
        reference: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(sum of row losses, rows, {"flow/loss": mean})``; pure and jit-safe."""
        del reference
        losses = self._row_losses(variables, batch, key, train=True)
        rows = jnp.asarray(losses.shape[0], jnp.float32)
        return jnp.sum(losses), rows, {"flow/loss": jax.lax.stop_gradient(jnp.mean(losses))}

    def evaluate(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Validation flow-matching ``loss`` (summed) and ``weight`` (rows), no dropout."""
        losses = self._row_losses(variables, batch, key, train=False)
        return {"loss": jnp.sum(losses), "weight": jnp.asarray(losses.shape[0], jnp.float32)}


__all__ = ["Autoencoder", "DiffusionObjective", "FlowModel"]

"""TrainState: everything a training run carries from one step to the next."""

from __future__ import annotations

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

"""The objective protocol every Trainer objective implements.

An objective owns the model, its initial variables and a pure loss. The Trainer owns
everything else (optimizer, sharding, accumulation, EMA, checkpoints).

Loss convention (sum and weight): ``loss(variables, batch, key, reference)`` returns
``(loss_sum, weight, metrics)`` where ``loss_sum`` is the SUM of the per-unit losses of this
(micro)batch and ``weight`` the number of counted units (loss tokens for LM, pairs for DPO,
tokens or sessions for GRPO). The Trainer's step loss is ``sum(loss_sum) / sum(weight)`` over
every microbatch and every device of the step, so ``k`` microbatches of size ``B`` give the
same update as one batch of size ``k * B``. ``weight`` is treated as a constant (no gradient
flows through it). ``metrics`` are scalars: one named ``<name>_sum`` is summed over the step
and reported as ``<name>`` = ``sum / sum(weight)``; any other metric is reported as the
weight-averaged value of the microbatches' metrics.

EMA rule (``ema_decay``):

- ``None``: no EMA is kept (``TrainState.ema`` is ``None``; ``reference`` is ``None``).
- ``1.0``: a frozen reference, a copy of the initial variables that never moves (DPO, GRPO;
  those objectives refuse any other value).
- a float in ``(0, 1)``: a moving average ``ema = decay * ema + (1 - decay) * params`` updated
  after every optimizer update (SFT when asked for; ``LMObjective`` keeps none by default).

The reference passed to ``loss`` is ``TrainState.ema`` (or ``None``). An objective with a
frozen reference may define ``reference_variables(variables)`` to keep only part of the tree
there (PPO keeps its policy subtree, not the critic).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

Variables = dict[str, Any]
Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@runtime_checkable
class Objective(Protocol):
    """What the Trainer needs from an objective.

    Attributes:
      ema_decay: ``None`` (no EMA), ``1.0`` (frozen reference) or a decay in ``(0, 1)``.

    Optional method ``evaluate(variables, batch, key) -> dict[str, jax.Array]`` returns
    validation metrics for one batch as sums plus a ``"weight"`` entry. The Trainer adds them
    over every validation batch and reports each sum divided by the total weight, or, when
    the objective also has ``summarize_evaluation(totals) -> dict[str, float]``, what that
    returns (``LMObjective`` adds the perplexity there).
    """

    ema_decay: float | None

    def init(self, key: jax.Array) -> Variables:
        """Full variables mapping ``{"params": ...}``; returns ``pretrained`` when one was given."""
        ...

    def loss(
        self,
        variables: Variables,
        batch: Batch,
        key: jax.Array,
        reference: Variables | None = None,
    ) -> tuple[jax.Array, jax.Array, Metrics]:
        """``(loss_sum, weight, metrics)`` for one (micro)batch; pure and jit-safe."""
        ...


def validate_ema_decay(value: float | None, *, field: str = "ema_decay") -> float | None:
    """Check an EMA decay: ``None``, ``1.0`` or a float in ``(0, 1)``; return it as float."""
    if value is None:
        return None
    try:
        decay = float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{field}: expected None or a float in (0, 1], got {value!r}") from err
    if not (0.0 < decay <= 1.0):
        raise ValueError(f"{field}: expected None or a float in (0, 1], got {value!r}")
    return decay


def validate_pretrained(value: Any, *, field: str = "pretrained") -> Any:
    """Check a starting point: ``None`` or a full variables mapping with ``params``; return it."""
    if value is not None and (not hasattr(value, "keys") or "params" not in value):
        keys = f" with keys {sorted(value.keys())}" if hasattr(value, "keys") else ""
        raise ValueError(
            f"{field}: expected a full variables mapping with a 'params' collection "
            f"(for example state.params), got {type(value).__name__}{keys}"
        )
    return value


__all__ = [
    "Batch",
    "Metrics",
    "Objective",
    "Variables",
    "validate_ema_decay",
    "validate_pretrained",
]

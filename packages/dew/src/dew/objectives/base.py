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

Row contract (``seq_len``): every token objective's ``seq_len`` is the number of next-token
predictions per row, and its rows carry ``width = seq_len + 1`` ids (input ``ids[:, :-1]``,
targets ``ids[:, 1:]``). ``LMObjective``, ``DPOObjective``, ``GRPOObjective`` and
``PPOObjective`` all expose ``width``. The readers size rows their own way: ``TokenFile`` and
``ChatMessages`` take the same ``seq_len`` (rows of ``seq_len + 1``); ``PreferencePairs``
takes the row width itself (``PreferencePairs(seq_len=S)`` pairs with
``DPOObjective(seq_len=S - 1)``); ``Prompts`` takes the prompt width ``P`` and a GRPO run
that samples ``R`` ids per prompt uses ``GRPOObjective(seq_len=P + R - 1)``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

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

    Optional attribute ``pretrained``: the full variables ``init`` returns, or ``None`` when
    ``init`` builds fresh ones. When it is set the Trainer runs ``init`` outside ``jit``, so
    the weights are not compiled into the program as constants (``starts_from_variables``).
    A Trainer made with ``consume_pretrained=True`` sets it (and ``critic_pretrained``) to
    ``None`` once its first state owns those arrays (``release_pretrained``).

    Optional method ``reference_variables(variables)``: the part of the variables kept as the
    frozen reference (see the EMA rule above); the Trainer's init reads it.

    Optional attribute ``frozen_collections``: names of variable collections the run never
    changes (the frozen base of ``dew.objectives.lora.LoraObjective``); checkpoints leave them
    out and a resumed state takes them from ``init``. With it, the optional method
    ``frozen_identity(variables)`` returns a JSON-ready description of them (path, hash) that
    checkpoints record and a resume must match (``dew.trainer.frozen``).

    Optional attribute ``token_fields``: the batch columns whose size counts as tokens for
    the ``tokens_per_s`` metric; the first one present in a batch is counted. Without it,
    ``TOKEN_FIELDS`` is used (``token_fields_of``).

    Optional attribute ``key_metrics``: the names of the metrics the console line shows
    (a tuple of strings, default ``("loss",)``): GRPO and PPO add ``reward/mean``, DPO
    ``rewards/accuracy`` and ``rewards/margin``.
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


TOKEN_FIELDS = ("text", "input_ids", "tokens")


def starts_from_variables(objective: Any) -> bool:
    """Whether ``objective.init`` returns given variables (its optional ``pretrained``)."""
    return getattr(objective, "pretrained", None) is not None


def token_fields_of(objective: Any) -> tuple[str, ...]:
    """The batch columns counted as tokens: the objective's ``token_fields`` or ``TOKEN_FIELDS``."""
    return tuple(getattr(objective, "token_fields", TOKEN_FIELDS))


def initial_variables(model: Any, pretrained: Any, key: jax.Array, length: int) -> Variables:
    """``pretrained`` (as a dict) when given, else ``model.init`` on one ``[1, length]`` row of id 0."""
    if pretrained is not None:
        return dict(pretrained)
    return dict(model.init(key, jnp.zeros((1, length), jnp.int32)))


#: The fields through which an objective holds its starting variables.
PRETRAINED_FIELDS = ("pretrained", "critic_pretrained")


def _is_objective(value: Any) -> bool:
    """Whether ``value`` is an objective instance (its class defines ``init`` and ``loss``)."""
    kind = type(value)
    return not isinstance(value, type) and all(
        callable(getattr(kind, name, None)) for name in ("init", "loss")
    )


def release_pretrained(objective: Any) -> int:
    """Drop the references ``objective`` keeps to its starting variables; the count dropped.

    Every ``PRETRAINED_FIELDS`` entry set in the objective's own instance ``__dict__`` becomes
    ``None``, and the same is done, recursively, for every objective held directly in one of
    its instance attributes (duck-typed: a class with callable ``init`` and ``loss``). The
    wrappers this reaches are:

    * ``LoraObjective``: the wrapped objective (``objective``) and its adapter-model copy
      (``policy``, a shallow copy that keeps its own ``pretrained`` reference);
    * ``PPOObjective``: its GRPO policy half (the private ``_policy``, which holds the same
      ``pretrained``), beside its own ``pretrained`` and ``critic_pretrained``;
    * ``LoraPPOObjective``: the wrapped PPO objective (``objective``) and its adapter copy
      (``ppo``), and through them PPO's ``_policy``.

    Why a walk of ``__dict__``: each wrapper keeps its inner objectives under names of its
    own (``objective``, ``policy``, ``ppo``, the private ``_policy``) and no interface lists
    them, so walking the attributes finds them without any wrapper class having to cooperate
    (no release hook to implement, and a new wrapper that keeps its inner objective in an
    attribute is covered as it is); reading ``__dict__`` rather than ``getattr`` also skips
    the LoRA wrappers' forwarding ``__getattr__``. Objectives inside containers (a list, a
    dict) are not reached. A field that cannot be assigned (a frozen dataclass) is left as
    it is. Afterwards ``init`` of these objectives builds fresh variables, and something else
    (the Trainer's first state) must own the arrays: ``Trainer(consume_pretrained=True)``
    calls this once it does.
    """
    pending, seen, dropped = [objective], set(), 0
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        fields = getattr(node, "__dict__", {})
        for name in PRETRAINED_FIELDS:
            if fields.get(name) is None:
                continue
            try:
                setattr(node, name, None)
            except (AttributeError, TypeError):  # frozen: the Trainer still owns the buffers
                continue
            dropped += 1
        pending.extend(v for v in fields.values() if _is_objective(v))
    return dropped


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
    "TOKEN_FIELDS",
    "Batch",
    "Metrics",
    "Objective",
    "PRETRAINED_FIELDS",
    "Variables",
    "initial_variables",
    "release_pretrained",
    "starts_from_variables",
    "token_fields_of",
    "validate_ema_decay",
    "validate_pretrained",
]

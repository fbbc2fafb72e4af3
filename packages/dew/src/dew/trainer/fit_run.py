"""One ``Trainer.fit`` call's loop state and its steps: fetch a batch, update, then log,
evaluate and checkpoint when due. ``Trainer.fit`` reads as the sequence of these steps."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dew.data.dataset import Dataset
from dew.mesh import global_batch
from dew.objectives.base import token_fields_of
from dew.progress import Progress
from dew.trainer import checkpoint as ckpt
from dew.trainer import frozen
from dew.trainer.state import TrainState
from dew.trainer.tracker import Tracker

if TYPE_CHECKING:
    from dew.trainer.trainer import Trainer


class NonFiniteLossError(FloatingPointError):
    """The loss of a step was NaN or infinite; the run stopped without saving it."""


def _to_host(metrics: Any) -> Any:
    """The one place the loop copies a step's metrics to the host (tests watch it)."""
    return jax.device_get(metrics)


def _count_tokens(batch: Mapping[str, Any], fields: tuple[str, ...]) -> int:
    for name in fields:
        if name in batch:
            return int(np.size(batch[name]))
    first = next(iter(batch.values()))
    return int(np.shape(first)[0]) if np.ndim(first) else 1


def rollout_extra(rollout: Any) -> dict[str, Any]:
    """``{"rollout": state}`` for a rollout with a ``state_dict`` that holds something, else {}.

    A stateful rollout (a KL controller's coefficient, ``dew.rollouts.shaping``) returns a
    JSON-ready mapping; the checkpoint keeps it beside the step and hands it back on resume
    (``Trainer._starting_state``)."""
    state_dict = getattr(rollout, "state_dict", None)
    state = state_dict() if callable(state_dict) else None
    return {"rollout": state} if state else {}


@dataclasses.dataclass
class FitRun:
    """What one ``Trainer.fit`` call changes as it goes: the state, the data position, the step
    whose metrics are not yet checked, the tokens since the last log and the last saved step."""

    trainer: Trainer
    data: Dataset
    steps: int
    state: TrainState
    position: int
    run_dir: str | None
    progress: Progress
    trackers: list[Tracker]
    pending: tuple[int, Any] | None = None
    tokens: int = 0
    last_saved: int | None = None
    frozen_identity: dict[str, Any] | None = None
    t_last: float = dataclasses.field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.token_fields = token_fields_of(self.trainer.objective)

    def check(self, entry: tuple[int, Any]) -> dict[str, float]:
        """A step's metrics on the host; ``NonFiniteLossError`` when its loss is not finite."""
        number, metrics = entry
        host = {k: float(v) for k, v in _to_host(metrics).items()}
        if not math.isfinite(host["loss"]):
            raise NonFiniteLossError(
                f"step {number}: the loss is {host['loss']} (not finite); stopped without "
                "saving this step"
            )
        return host

    def save(self, number: int) -> None:
        """Checkpoint step ``number`` into the run directory, once, when there is one."""
        if self.run_dir is None or self.last_saved == number:
            return
        objective = self.trainer.objective
        if self.frozen_identity is None:  # frozen weights never change: described once
            self.frozen_identity = frozen.identity(objective, self.state)
        ckpt.save(
            self.run_dir,
            frozen.without_frozen(self.state, frozen.frozen_names(objective)),
            step=number,
            position=self.position,
            keep=self.trainer.keep_checkpoints,
            extra={
                "updates": int(jax.device_get(self.state.updates)),
                **rollout_extra(self.trainer.rollout),
                **self.frozen_identity,
            },
        )
        self.last_saved = number

    def next_batch(self, stream: Any, number: int) -> dict[str, Any]:
        """The next local batch of the training stream, rolled out when there is a rollout."""
        try:
            local = next(stream)
        except StopIteration:
            raise ValueError(
                f"data: the training stream ended after {self.position} batches, before "
                f"step {number} of {self.steps}"
            ) from None
        self.position += 1
        local = dict(local)
        rollout = self.trainer.rollout
        if rollout is not None:
            key = jax.random.fold_in(self.trainer._rollout_key, number)
            at_step = getattr(rollout, "at_step", None)
            if callable(at_step):
                at_step(number, int(jax.device_get(self.state.updates)))
            local = dict(rollout(self.state.params, local, key))
        return local

    def update(self, step_fn: Any, number: int, local: dict[str, Any]) -> None:
        """Run step ``number``'s update and show the previous step's loss, done by now."""
        self.tokens += _count_tokens(local, self.token_fields) * jax.process_count()
        self.state, metrics = step_fn(self.state, global_batch(local, self.trainer.mesh))
        if self.pending is not None:  # the previous step: done by now, no wait
            self.progress.update(self.pending[0], self.check(self.pending)["loss"])
        self.pending = (number, metrics)

    def report(
        self, number: int, log_every: int | None, eval_every: int | None, *, stopping: bool
    ) -> None:
        """Log, evaluate and checkpoint step ``number`` when it is due for any of them."""
        steps = self.steps
        checkpoint_every = self.trainer.checkpoint_every
        log_now = log_every is not None and number % log_every == 0
        ckpt_now = checkpoint_every is not None and number % checkpoint_every == 0
        eval_now = eval_every is not None and number % eval_every == 0
        if not (log_now or ckpt_now or eval_now or number == steps or stopping):
            return
        assert self.pending is not None
        host = self.check(self.pending)
        self.pending = None
        self.progress.update(number, host["loss"])
        record: dict[str, Any] = {"step": number}
        val: dict[str, Any] = {}
        if eval_now:  # before the log line, which shows the validation metrics
            for name, value in self.trainer.evaluate(self.state.params, self.data).items():
                val[f"val/{name}"] = value
        if log_now or number == steps:
            self._log(record, host, number, val)
        elif val:
            record.update(val)
            self.progress.log(record)
        if len(record) > 1 and (log_now or eval_now or number == steps):
            for tracker in self.trackers:
                tracker.write(record)
        if ckpt_now or number == steps or stopping:
            self.save(number)

    def _log(
        self, record: dict[str, Any], host: dict[str, float], number: int, val: dict[str, Any]
    ) -> None:
        """Add the metrics, throughput, learning rate and ``val`` to ``record``; show it."""
        now = time.perf_counter()
        record.update(host)
        record["tokens_per_s"] = self.tokens / max(now - self.t_last, 1e-9)
        self.tokens, self.t_last = 0, now
        lr = self.trainer._learning_rate(self.state, number)
        if lr is not None:
            record["learning_rate"] = lr
        record.update(getattr(self.trainer.rollout, "last_metrics", None) or {})
        record.update(val)
        self.progress.log(record)

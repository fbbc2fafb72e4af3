"""FlowSource: Flow-GRPO samples as sessions, for ``dew.rollout.RolloutScheduler``.

The scheduler runs flow models on the stack it runs text on: it submits one ``Task`` per
source row and sample (``tasks`` turns a batch of condition rows into tasks), holds the
drawn sessions to its staleness bound, pushes weights with ``load`` and packs the admitted
groups with ``dew.flow.FlowPacker``. A ``FlowSource`` is its own ``weights``: it samples with
the variables last loaded, and stamps each session with their version.

Each submission is drawn on one worker thread, one sample at a time (a batch of one, compiled
once): an SDE trajectory of ``steps`` time points from the key of the submission's ``seed``
(so a redrawn attempt after a crash draws the same sample), scored by
``reward(images [1, H, W, C], fields) -> [1]``. The future's ``Session`` is COMPLETED with
that ``reward``, ``version`` and a ``payload`` of the kept transitions (``states`` /
``next_states`` ``[S, ...]``, ``times`` / ``next_times`` / ``scales`` /
``behavior_log_probs`` / ``stochastic`` ``[S]``) and the encoders' fields of the row. A
reward that raises or returns something else than one finite number fails the future with
``RewardError``, which the scheduler raises to the trainer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np

from dew.flow.draws import check_flow_parts, compiled_draw, score, trained_transitions
from dew.sessions.records import Session, Task


class FlowSource:
    """A ``SessionSource`` and its weights for flow models (module docstring).

    Args:
      objective: the ``FlowGRPOObjective`` being trained.
      reward: ``reward(images, fields) -> [N]`` finite numbers, as ``FlowRollout`` takes it
        (images float32 ``[N, H, W, C]`` in ``[-1, 1]``; here ``N`` is 1).
      variables: the weights sampled with until the first ``load``, as version 0: the
        trainer's starting variables (pass them as the objective's ``pretrained`` too).
      steps: time points of the sampler (both ends); ``None``: the objective's ``steps``.
      train_steps: how many of the first stochastic transitions are kept; ``None``: all.
    """

    def __init__(
        self,
        objective: Any,
        reward: Any,
        variables: Mapping[str, Any],
        steps: int | None = None,
        train_steps: int | None = None,
    ) -> None:
        check_flow_parts(objective, reward)
        self.objective = objective
        self.reward = reward
        self.steps = objective.steps if steps is None else steps
        self.selected = trained_transitions(objective.process, self.steps, train_steps)
        self._draw = compiled_draw(objective, self.steps, self.selected)
        self._lock = threading.Lock()
        self._variables = jax.device_get(variables)
        self._version = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- weights ----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The version of the weights new draws use."""
        with self._lock:
            return self._version

    def load(self, variables: Mapping[str, Any], version: int) -> None:
        """Draw with ``variables`` (copied to the host) as ``version`` from now on."""
        copy = jax.device_get(variables)
        with self._lock:
            self._variables, self._version = copy, int(version)

    # -- the session source -----------------------------------------------------------------

    def tasks(self, batch: Mapping[str, Any]) -> list[Task]:
        """One ``Task`` per row of a source batch: id ``0 .. B-1``, the row's conditions."""
        inputs = self.objective.inputs
        inputs.check(batch, target=False)
        names = [f.name for f in inputs.conditions]
        return [
            Task(row, {name: np.asarray(batch[name])[row] for name in names})
            for row in range(inputs.rows(batch))
        ]

    def submit(self, task: Task, *, seed: int) -> Future[Session]:
        """Queue one draw for ``task``; its future holds the scored ``Session``."""
        if self._closed:
            raise RuntimeError("FlowSource: closed; submit before close()")
        future: Future[Session] = Future()
        self._queue.put((future, task, int(seed)))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="flow-source", daemon=True)
            self._thread.start()
        return future

    def cancel(self, future: Future[Session]) -> None:
        """Cancel a queued draw (one already drawing finishes; its session is dropped)."""
        future.cancel()

    def close(self) -> None:
        """Cancel every queued draw and stop the worker."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FlowSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker -------------------------------------------------------------------------

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, task, seed = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._sample(task, seed))
            except BaseException as err:  # noqa: BLE001 - handed to the scheduler
                future.set_exception(err)

    def _sample(self, task: Task, seed: int) -> Session:
        obj = self.objective
        fields = {f.name: np.asarray(task.data[f.name])[None] for f in obj.inputs.conditions}
        with self._lock:
            variables, version = self._variables, self._version
        keys = jax.random.split(jax.random.key(np.uint32(seed)), 1)
        out = jax.device_get(self._draw(variables, obj.fields(fields), keys))
        images = np.asarray(out.pop("images"), np.float32)
        reward = score(self.reward, images, fields)[0]
        payload = {name: np.asarray(v)[0] for name, v in out.items()}
        payload.update({name: v[0] for name, v in obj.fields(fields).items()})
        return Session(task=task.id, reward=float(reward), version=version, payload=payload)


__all__ = ["FlowSource"]

"""``RolloutScheduler``: the Trainer's rollout for any ``SessionSource``, submitting ahead.

Each call (one training batch ``i``, with ``u`` updates committed):

1. batches the trainer's stream registered but nobody submitted yet (the first call, a
   resumed run, ``ahead=0``) are submitted, each under the version the journal says it had
   (weights reloaded from the journal) or else under the served weights;
2. batch ``i`` is collected: its rollouts are admitted by status (``admission``), failures
   resubmitted under the served weights, until every group is complete, cut or abandoned;
3. with several processes, every process learns whether any failed, and all raise together;
4. when the served version is ``sync_every`` or more behind ``u``, the current weights are
   pushed as version ``u`` (a push that leaves the version where it was is tried once more,
   then raises);
5. batches ``i + 1 .. i + ahead`` are submitted under the served version, so they draw while
   the trainer updates on batch ``i``;
6. batch ``i``'s complete groups are packed (``packer``: by default ``[rows, width]`` token
   rows) and ``old_log_probs`` is rescored under the trainer's current weights (the proximal
   policy); ``behavior_log_probs`` keeps the engine's (or the flow sampler's);
7. the waiting share and the off-policy gap are measured (``staleness``); an
   ``AdaptiveAhead`` given as ``ahead`` chooses from them the ``ahead`` of the next call.

A first submission is at most ``ahead + sync_every - 1`` updates old when it trains, so
construction refuses ``max_lag`` below that, and any ``max_lag > 0`` needs the objective's
behavior correction (``GRPOObjective(behavior_importance=...)``, a TIS cap or an IcePop band).
Collecting batch ``i`` before pushing keeps every draw on one version when ``ahead=1``, which
with a ``journal`` makes a resumed run redraw exactly what the crash left in flight. An
adaptive ``ahead`` moves within ``[0, max_lag - sync_every + 1]``; the read-ahead and the
journal are sized for its top, and batches submitted beyond a lowered horizon stay in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.data.dataset import Dataset
from dew.progress import TerminalBar
from dew.rollout.scheduler.admission import Admission, Rules, dynamic_rules, sampling_metrics
from dew.rollout.scheduler.checks import check_protocols, check_schedule, check_single_process
from dew.rollout.scheduler.checks import count as _count
from dew.rollout.scheduler.journal import WeightJournal
from dew.rollout.scheduler.packer import TokenPacker, check_packer
from dew.rollout.scheduler.record import SchedulerRecord
from dew.rollout.scheduler.staleness import AdaptiveAhead, staleness_metrics
from dew.rollout.scheduler.tasks import TaskReader, TaskStream, check_tasks
from dew.rollout.scheduler.work import COMPLETE, BatchWork, Entry
from dew.rollouts.episodes.cohort import agree_on_failure
from dew.sessions.chains import TRUNCATIONS
from dew.sessions.records import Session, check_choice


class RolloutScheduler:
    """Run GRPO rollouts from ``source`` while the trainer updates (module docstring).

    Args:
      objective: the ``GRPOObjective`` (its width must equal ``width``), or the objective
        ``packer`` packs for (``FlowGRPOObjective`` with ``dew.flow.FlowPacker``).
      source: a ``SessionSource`` (``PromptSource``, ``EnvironmentSource``, ``HarborSource``);
        what its optional ``metrics()`` returns joins each record's metrics.
      weights: what serves the source (``NativeRolloutServer``, ``Publication``, ...):
        ``load(variables, version)`` and ``version``.
      width: row width W; rows: rows N this process packs (both set by ``packer`` when one is
        given, and then refused here).
      tasks: ``batch -> list[Task]`` (``task_ids`` or ``prompt_tasks``).
      groups: admitted samples per task (G).
      max_lag: the oldest call an admitted rollout may have, in updates behind.
      ahead: batches submitted ahead of the one training, or an ``AdaptiveAhead`` that
        chooses it each call (``staleness``; single-process trainers only); sync_every: push
        after this many updates.
      max_attempts: failures per sample before its group is abandoned.
      timeout: seconds a rollout may run before it is cancelled and resubmitted.
      oversample: extra samples per group (the first G to finish are admitted).
      admit: admit only the first M complete groups of a batch.
      truncation, estimator, support_capacity, eos_ids: as ``pack`` takes them.
      seed: the run's seed; each attempt's source seed mixes it with the batch index, group,
        sample, attempt and process.
      log: receives a ``SchedulerRecord`` per call.
      journal: a directory for ``WeightJournal`` (exact resume of in-flight work); its writer
        lock is held until ``close``, so two schedulers cannot share one.
      progress: draw the progress bar (``None``: only on a terminal).
      correction: an ``AdaptiveCorrection`` (``dew.rollouts.correction_caps``): each packed
        batch carries the TIS cap (or IcePop band) measured from its own ratios of the
        rescored ``old_log_probs`` to ``behavior_log_probs``; the measurement joins the
        record's metrics and ``last_metrics``, and its running estimate is
        ``state_dict``'s (single-process trainers only).
      dynamic_sampling: a ``DynamicSampling`` (``dew.rollouts.dynamic_sampling``): DAPO's
        filter in admission (``admission``): its ``groups`` groups with signal train (it
        takes ``admit``'s place), uniform groups are drawn again up to ``max_draws`` rounds.
      packer: how admitted sessions become the batch (``dew.rollout.scheduler.packer``);
        ``None`` packs token rows (``TokenPacker`` of ``width``, ``rows``, ``truncation``,
        ``estimator``, ``support_capacity``, ``eos_ids``).
    """

    def __init__(
        self,
        objective: Any,
        source: Any,
        weights: Any,
        *,
        width: int | None = None,
        rows: int | None = None,
        tasks: TaskReader,
        groups: int,
        max_lag: int = 1,
        ahead: int | AdaptiveAhead = 1,
        sync_every: int = 1,
        max_attempts: int = 3,
        timeout: float | None = None,
        oversample: int = 0,
        admit: int | None = None,
        truncation: str = "mask",
        estimator: str = "group",
        support_capacity: int | None = None,
        eos_ids: Any = None,
        seed: int = 0,
        log: Callable[[SchedulerRecord], None] | None = None,
        journal: str | None = None,
        progress: bool | None = None,
        correction: Any = None,
        dynamic_sampling: Any = None,
        packer: Any = None,
    ) -> None:
        check_protocols(source, weights, tasks)
        check_choice(truncation, TRUNCATIONS, "truncation")
        packer = _packer(packer, objective, width, rows, truncation=truncation,
                         estimator=estimator, support_capacity=support_capacity,
                         eos_ids=eos_ids)  # fmt: skip
        groups = _count(groups, "groups", 1)
        top, sync_every, max_lag, adaptive = check_schedule(objective, ahead, sync_every, max_lag)
        if timeout is not None and not float(timeout) > 0:
            raise ValueError(f"timeout: expected None or seconds > 0, got {timeout!r}")
        if admit is not None:
            admit = _count(admit, "admit", 1)
        admit, max_draws = dynamic_rules(dynamic_sampling, admit)
        check_single_process(journal=journal, correction=correction, ahead=adaptive)
        self.objective = objective
        self.source = source
        self.weights = weights
        self.packer = packer
        self.rows, self.groups = packer.rows, groups
        self.ahead = top if adaptive is None else adaptive.ahead  # the current one
        self.top, self.adaptive, self.sync_every, self.max_lag = top, adaptive, sync_every, max_lag
        self.samples = groups + _count(oversample, "oversample", 0)
        self.truncation = truncation
        self.seed = _count(seed, "seed", 0)
        self.log = log
        self.task_reader = tasks
        self.rules = Rules(groups, self.rows, max_lag,
                           _count(max_attempts, "max_attempts", 1), truncation,
                           None if timeout is None else float(timeout), admit,
                           max_draws)  # fmt: skip
        self.admission = Admission(self.rules, packer, self._resubmit, self._cancel, self._tick)
        self.journal = None if journal is None else WeightJournal(journal, top + sync_every + 1)
        self.stream = TaskStream(top, self._reopen)
        self.progress = TerminalBar("rollouts", "groups", enabled=progress)
        self._work: dict[int, BatchWork] = {}
        self.last_sessions: list[Session] = []
        self._waiting_since = time.perf_counter()
        self._collected: float | None = None  # when the last collection ended
        self._updates: int | None = None
        self._step = 0
        self.correction = correction
        self.last_metrics: dict[str, float] = {}

    # -- the trainer's side ---------------------------------------------------------------

    def tasks(self, dataset: Dataset) -> Dataset:
        """``dataset`` whose stream registers each batch as it is read (train on this one)."""
        return self.stream.wrap(dataset)

    def at_step(self, step: int, updates: int) -> None:
        """The Trainer's clock: the step being attempted and the updates committed."""
        self._step, self._updates = int(step), int(updates)

    def __call__(self, variables: Any, batch: Mapping[str, Any], key: Any = None) -> dict:
        """Collect, pack and rescore the rollouts of ``batch`` (see the module docstring)."""
        index = self.stream.take(batch)
        updates = self._updates if self._updates is not None else index
        self._updates = None
        error: BaseException | None = None
        start = self._waiting_since = time.perf_counter()
        try:
            self._submit_pending(variables, index, updates)
            if updates - int(self.weights.version) > self.max_lag:
                # the trainer ran ahead of the schedule: refresh before resubmitting
                self._push(variables, updates)
            for work in list(self._work.values()):
                self.admission.expire(work, updates)
            work = self._work[index]
            self.admission.collect(work, updates)
        except BaseException as caught:  # noqa: BLE001 - agreed with the other processes
            error = caught
            self._cancel_all()
        end = time.perf_counter()
        waited, cycle, self._collected = end - start, self._collected, end
        agree_on_failure(error)
        pushed = self._maybe_push(variables, updates)
        for later in range(index + 1, index + self.ahead + 1):
            self._submit_batch(later)
        del self._work[index]
        self.stream.forget(index)
        out, record = self._pack(variables, work, updates, waited, pushed)
        self._adapt(out, record.metrics, waited, None if cycle is None else end - cycle)
        self.progress.close()
        if self.log is not None:
            self.log(record)
        return out

    def close(self) -> None:
        """Cancel every rollout still in flight and release the journal's writer lock."""
        self._cancel_all()
        self.progress.close()
        if self.journal is not None:
            self.journal.close()

    # -- submission -----------------------------------------------------------------------

    def _reopen(self, start: int) -> None:
        self._cancel_all()
        self._work.clear()
        self._collected = None

    def _adapt(self, out: Mapping[str, Any], metrics: dict, waited: float,
               cycle: float | None) -> None:  # fmt: skip
        """Measure the batch (``staleness``); an adaptive ``ahead`` chooses the next one."""
        share = None if cycle is None else waited / cycle
        measured = staleness_metrics(out, self.ahead, share, mask=self.packer.mask)
        if cycle is not None:
            measured["staleness/cycle"] = cycle
        if self.adaptive is not None:
            self.ahead = self.adaptive.observe(share, measured["staleness/gap"], cycle)
        measured["staleness/next_ahead"] = float(self.ahead)
        metrics.update(measured)
        self.last_metrics = {**self.last_metrics, **measured}

    def _submit_pending(self, variables: Any, index: int, updates: int) -> None:
        for earlier in range(index, index + self.top):
            if earlier in self._work or self.stream.registered(earlier) is None:
                continue
            version = None if self.journal is None else self.journal.version_of(earlier)
            if earlier >= index + self.ahead and version is None:
                continue  # beyond the current horizon and never submitted
            if version is not None and version != self.weights.version:
                kept = (
                    self.journal.weights(version, self._sent(variables)) if self.journal else None
                )
                if kept is not None:
                    self._push(kept, version)
            if version is None or version != self.weights.version:
                self._maybe_push(variables, updates)
            self._submit_batch(earlier)
        if index not in self._work:
            self._maybe_push(variables, updates)
            self._submit_batch(index)

    def _submit_batch(self, index: int) -> None:
        batch = self.stream.registered(index)
        if batch is None or index in self._work:
            return
        tasks = check_tasks(self.task_reader(batch), index)
        work = BatchWork(index, tasks, self.samples, self.seed, jax.process_index())
        self._work[index] = work
        if self.journal is not None:
            self.journal.submitted(index, int(self.weights.version))
        for group in range(len(tasks)):
            for sample in range(self.samples):
                self._submit(work, group, sample, first=True)

    def _submit(self, work: BatchWork, group: int, sample: int, first: bool = False) -> None:
        state = work.groups[group]
        if not first:
            state.attempts[sample] += 1
        attempt = state.attempts[sample]
        version = int(self.weights.version)
        future = self.source.submit(state.task, seed=work.seed_of(group, sample, attempt))
        work.add(Entry(group, sample, attempt, future, version, work.now()))

    def _resubmit(self, work: BatchWork, group: int, sample: int) -> None:
        self._submit(work, group, sample)

    def _tick(self, work: BatchWork) -> None:
        total = sum(g.state == COMPLETE for g in work.groups)
        in_flight = sum(len(w.entries) for w in self._work.values())
        waited = time.perf_counter() - self._waiting_since
        detail = f"{in_flight} in flight, waited {waited:.2f}s"
        self.progress.update(total, len(work.groups), detail)

    def _cancel(self, entry: Entry) -> None:
        self.source.cancel(entry.future)

    def _cancel_all(self) -> None:
        for work in self._work.values():
            for entry in list(work.entries.values()):
                work.pop(entry.future)
                self._cancel(entry)

    # -- pushes ---------------------------------------------------------------------------

    def _maybe_push(self, variables: Any, updates: int) -> int | None:
        if updates - int(self.weights.version) < self.sync_every:
            return None
        self._push(variables, updates)
        return updates

    def _sent(self, variables: Any) -> Any:
        """What a push copies and sends of ``variables``, and so what the journal keeps: the
        ``select`` of the publisher's push or of the server itself (an adapter push, e.g.
        ``NativeAdapterServer``: the adapter alone), else all of them."""
        push = getattr(getattr(self.weights, "weights", None), "push", None)
        select = getattr(push, "select", None) or getattr(self.weights, "select", None)
        return select(variables) if callable(select) else variables

    def _push(self, variables: Any, version: int) -> None:
        copy = jax.tree.map(lambda x: jnp.array(x, copy=True), self._sent(variables))
        for _ in range(2):
            self.weights.load(copy, version)
            if int(self.weights.version) == version:
                if self.journal is not None:
                    self.journal.pushed(copy, version)
                return
        raise RuntimeError(
            f"weights: pushing version {version} left the served version at "
            f"{self.weights.version}, twice"
        )

    # -- packing --------------------------------------------------------------------------

    def _pack(
        self, variables: Any, work: BatchWork, updates: int, waited: float, pushed: int | None
    ) -> tuple[dict[str, Any], SchedulerRecord]:
        complete = [g for g in work.groups if g.state == COMPLETE]
        sessions: list[Session] = [g.admitted[s] for g in complete for s in sorted(g.admitted)]
        latencies = [g.latencies[s] for g in complete for s in sorted(g.admitted)]
        self.last_sessions = sessions
        out, metrics = self.packer.pack(sessions, latencies, updates)
        out["old_log_probs"] = self.packer.rescore(variables, out)
        versions = [v for s in sessions for v in s.policy_versions()]
        oldest = min(versions) if versions else updates
        metrics.update(sampling_metrics(work, self.rules))
        source_metrics = getattr(self.source, "metrics", None)  # e.g. re-grading's counts
        if callable(source_metrics):
            metrics.update(source_metrics())
        if self.correction is not None:  # bounds measured on this batch's own ratios
            columns, measured = self.correction.observe(
                out, out["old_log_probs"], out["behavior_log_probs"], mask=self.packer.mask
            )
            out.update(columns)
            metrics.update(measured)
        # the trainer logs these with the step (console, metrics.jsonl, trackers), as it logs
        # a synchronous rollout's: the reward and its components among them
        self.last_metrics = dict(metrics)
        counts = work.counts
        record = SchedulerRecord(
            step=self._step, index=work.index, updates=updates, version=oldest,
            lag=updates - oldest, admitted_groups=len(complete), groups=len(work.groups),
            resubmitted={k.split("/", 1)[1]: v for k, v in counts.items() if "/" in k},
            cancelled=counts["cancelled"], abandoned=counts["abandoned"], cut=counts["cut"],
            waited=waited, pushed=pushed, metrics=metrics,
        )  # fmt: skip
        return out, record

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the scheduler: its correction bounds and its ``ahead``
        controller, if it adapts them (the weights and submissions are the journal's)."""
        state = {} if self.correction is None else {"correction": self.correction.state_dict()}
        if self.adaptive is not None:
            state["ahead"] = self.adaptive.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``'s output."""
        if self.correction is not None and "correction" in state:
            self.correction.load_state_dict(state["correction"])
        if self.adaptive is not None and "ahead" in state:
            self.adaptive.load_state_dict(state["ahead"])
            self.ahead = self.adaptive.ahead


def _packer(packer: Any, objective: Any, width: Any, rows: Any, **token: Any) -> Any:
    """The packer given (``width`` and ``rows`` then unset) or a ``TokenPacker``."""
    if packer is None:
        return TokenPacker(objective, _count(width, "width", 2), _count(rows, "rows", 1), **token)
    check_packer(packer)
    for name, value in (("width", width), ("rows", rows)):
        if value is not None:
            raise ValueError(f"{name}: the packer sets the batch's shape; expected it unset, "
                             f"got {value!r}")  # fmt: skip
    _count(packer.rows, "packer.rows", 1)
    return packer


__all__ = ["RolloutScheduler"]

"""EpisodeRollout: multi-turn tool episodes as the Trainer's ``rollout=`` hook.

Each Trainer step hands over a batch with integer ``task_id`` rows ``[B]`` and the current
variables. One collection:

1. binds the policy once (``policy.bind(variables)``) and gives every record of this binding
   one private origin token;
2. opens ``B * G`` episodes: ``environment_factory(EpisodeId(task, step, sample, seed))``,
   entered and reset, where ``step`` is the attempted training step and ``seed`` is drawn from
   the step's key for the slot's global position;
3. runs ``max_turns`` rounds. In each round all local slots are sampled together in one
   policy call (with ``device_shards=True``, one call per local device, see ``cohort``): live slots with their exact context and a budget of
   ``max_new_tokens``, finished slots with an inert one-id prompt whose output is thrown
   away, so the batch keeps its shape and row order and no draw shifts.
   A turn that used its budget without EOS ends the episode as TRUNCATED and is not sent to
   the environment; a context longer than ``max_prompt_tokens`` and a live episode at
   ``max_turns`` end it as TRUNCATED too (the recorded contexts stay whole). Every other turn
   goes to ``environment.step``;
4. when an episode ends, the verifier scores it while its environment is still open, then the
   environment is released (a failed release discards the episode) and, with ``regrade=``,
   a completed episode is scored again in a clean sandbox (a disagreement discards it);
5. packs every episode with ``session_of`` (group = the task row) and ``pack`` into
   ``[B * G * max_turns, max_prompt_tokens + max_new_tokens]`` rows: raw and behavior
   likelihoods are the policy's own, truncated and errored episodes are masked and out of
   their group's baseline; ``session_index`` numbers the whole cohort's episodes (rank ``r``'s
   ``rewards[i]`` is episode ``r * B * G + i``), like the group ids. Set
   ``GRPOObjective(seq_len=max_prompt_tokens + max_new_tokens - 1)``.

With several processes, ranks first agree on the cohort configuration and, after opening and
after every round, on whether any rank failed (see ``cohort``). Any exception from the
factory, an environment, the policy or the verifier, and any cancellation, aborts the
collection before the update: every open environment exits under the
original exception first, then ``EpisodeFailure`` / ``EpisodeCancelled`` is raised with the
partial episode and the original as ``__cause__``.

``last_timings`` holds the seconds of the latest collection: ``generation`` (policy calls),
``tool`` (environment time summed over slots), ``tool_wall`` (wall time of the concurrent
environment calls), ``collection`` and ``pack``.

Clocks: the Trainer calls ``at_step(step, updates)`` before each collection (attempted step,
committed updates; actions carry ``updates`` as ``policy_step``). Called without it, the
rollout counts its own collections from 1 and uses ``step - 1`` as the update clock.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.checks import is_integer
from dew.progress import TerminalBar
from dew.rollouts.episodes.cohort import (
    agree_on_config,
    agree_on_failure,
    local_variables,
    shard_count,
    task_ids,
)
from dew.rollouts.episodes.collection import (
    abort_collection,
    draw_slots,
    finish_slot,
    prepare_action,
    recover,
)
from dew.rollouts.episodes.journal import EpisodeJournal
from dew.rollouts.episodes.projection import project
from dew.rollouts.episodes.protocol import (
    Action,
    EnvironmentFactory,
    Episode,
    EpisodeStatus,
    Record,
    Verifier,
)
from dew.rollouts.episodes.slot import Slot
from dew.rollouts.episodes.validation import check_collaborators
from dew.sampling import Sampling
from dew.sessions.regrade import Regrade

INERT_CONTEXT = np.zeros((1,), np.int32)


def _positive(value: Any, name: str, minimum: int = 1) -> int:
    if not is_integer(value) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


class EpisodeRollout:
    """Collect ``groups`` episodes per task and pack them for GRPO (see the module docstring).

    Args:
      policy: has ``bind(snapshot)`` and ``__call__(contexts, budgets, key, sampling)``
        returning one generation per context with ``ids``, ``raw_log_probs``,
        ``behavior_log_probs`` and ``eos`` (``dew.inference.TextGeneration``).
      environment_factory: ``EpisodeId -> Environment``.
      verifier: ``Episode -> float``.
      max_prompt_tokens: the longest context a turn may read (P).
      max_new_tokens: the response budget of each turn (R).
      max_turns: model calls per episode (K).
      groups: episodes per task (G).
      sampling: ``dew.sampling.Sampling`` (EOS ids end a turn).
      journal: optional :class:`EpisodeJournal`: pending draws and completed turns are
        committed as they happen and reused when the same step is attempted again after a
        crash (environments then need ``get_state``/``set_state``).
      estimator: ``"group"``, ``"mean"`` or ``"rloo"`` as ``pack`` takes them.
      record: optional callback receiving every finished or failed episode.
      progress: draw a progress bar (``None``: only on a terminal).
      device_shards: sample each local device's share of the slots in its own policy call
        with its own key (``cohort``), so that a collection gives the same draws, likelihoods
        and packed rows however the global devices are split over processes. The default
        samples all local slots of a round in one call.
      environment_threads: how many environments open, reset and step at the same time
        (threads kept for the rollout's life, so a subprocess tool's parent-death signal stays
        armed); the verifier, releases, re-grades and ``record`` run on the calling thread,
        in slot order. 1 runs everything on the calling thread.
      regrade: a regrader (``collect(task, environment)``, ``grade(task, artifact)``,
        ``dew.sessions.regrade``; the task is ``Task(episode.id.task)``) that scores each
        completed episode again in a clean sandbox, or None; regrade_tolerance: the largest
        difference of the two rewards that still agrees. An episode whose clean reward
        differs (or whose re-grade failed) becomes ERROR with no reward and the reason as
        its detail (``regrade rejected: ...``): its rows are masked and it leaves its
        group's baseline, so it contributes no gradient while the batch keeps its shape.
        There is no retry: the step trains on the group's other episodes.
    """

    def __init__(
        self,
        policy: Any,
        environment_factory: EnvironmentFactory,
        verifier: Verifier,
        max_prompt_tokens: int,
        max_new_tokens: int,
        max_turns: int,
        groups: int,
        sampling: Sampling,
        journal: EpisodeJournal | None = None,
        *,
        estimator: str = "group",
        record: Record | None = None,
        progress: bool | None = None,
        device_shards: bool = False,
        environment_threads: int = 16,
        regrade: Any = None,
        regrade_tolerance: float = 1e-6,
    ) -> None:
        check_collaborators(policy, environment_factory, verifier, record, sampling)
        self.policy = policy
        self.environment_factory = environment_factory
        self.verifier = verifier
        self.max_prompt_tokens = _positive(max_prompt_tokens, "max_prompt_tokens")
        self.max_new_tokens = _positive(max_new_tokens, "max_new_tokens")
        self.max_turns = _positive(max_turns, "max_turns")
        self.groups = _positive(groups, "groups")
        if journal is not None and not isinstance(journal, EpisodeJournal):
            raise TypeError(f"journal: expected None or an EpisodeJournal, got {type(journal)}")
        self.sampling = sampling
        self.journal = journal
        self.estimator = estimator
        self.record = record
        self.progress = progress
        self.device_shards = bool(device_shards)
        self.environment_threads = _positive(environment_threads, "environment_threads")
        self.regrade = None if regrade is None else Regrade(regrade, regrade_tolerance)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.width = self.max_prompt_tokens + self.max_new_tokens
        self._clocks: tuple[int, int] | None = None
        self._calls = 0
        self._current: Slot | None = None
        self._shards = 1
        self._tool_wall = 0.0
        self.last_episodes: list[Episode] = []
        self.last_timings: dict[str, float] = {}

    # ------------------------------------------------------------------ clocks
    def at_step(self, step: int, updates: int) -> None:
        """The Trainer's clocks for the next collection: attempted step, committed updates."""
        self._clocks = (_positive(step, "step", 0), _positive(updates, "updates", 0))

    def _take_clocks(self) -> tuple[int, int]:
        self._calls += 1
        clocks = self._clocks if self._clocks is not None else (self._calls, self._calls - 1)
        self._clocks = None
        return clocks

    # ------------------------------------------------------------------ collection
    @property
    def last_metrics(self) -> dict[str, float]:
        """The re-grading counts so far as ``regrade/<name>`` (empty without ``regrade``);
        the Trainer adds them to its log record."""
        return {} if self.regrade is None else self.regrade.metrics()

    def _finish(self, slot: Slot, status: EpisodeStatus | None = None, detail: str = "") -> None:
        if status is not None:
            slot.end(status, detail)
        finish_slot(slot, self.verifier, self.record, self.regrade)

    def _round(self, slots: list[Slot], turn: int, key: jax.Array, policy_step: int) -> float:
        """One turn of every live slot; returns the generation seconds."""
        for slot in slots:
            if slot.running and slot.context.size > self.max_prompt_tokens:
                self._current = slot
                self._finish(
                    slot,
                    EpisodeStatus.TRUNCATED,
                    f"context of {slot.context.size} ids exceeds max_prompt_tokens="
                    f"{self.max_prompt_tokens}",
                )
        live = [slot.running for slot in slots]
        contexts = [s.context if on else INERT_CONTEXT for s, on in zip(slots, live)]
        budgets = [self.max_new_tokens if on else 1 for on in live]
        self._current = None
        seconds = 0.0
        outgoing: list[tuple[Slot, Action]] = []
        size = len(slots) // self._shards
        round_key = jax.random.fold_in(key, turn)
        for shard in range(self._shards):
            part = slice(shard * size, (shard + 1) * size)
            if not any(live[part]):
                continue  # each shard has its own key: skipping one shifts no other draw
            shard_key = jax.random.fold_in(round_key, jax.process_index() * self._shards + shard)
            start = time.perf_counter()
            drawn = self.policy(contexts[part], budgets[part], shard_key, self.sampling)
            seconds += time.perf_counter() - start
            if len(drawn) != size:
                raise ValueError(f"policy: expected {size} generations, got {len(drawn)}")
            for slot, on, context, generation in zip(
                slots[part], live[part], contexts[part], drawn
            ):
                if on:
                    self._current = slot
                    action = prepare_action(
                        slot, context, generation, policy_step, self.sampling, self.max_new_tokens
                    )
                    if action is not None:
                        outgoing.append((slot, action))
        self._current = None
        self._concurrently([(slot.send, (action,), slot) for slot, action in outgoing])
        for slot, on in zip(slots, live):
            if on and not slot.running:
                self._current = slot
                self._finish(slot)
        return seconds

    def _concurrently(self, calls: list[tuple[Any, tuple[Any, ...], Slot]]) -> None:
        """Run environment calls on the rollout's threads; the first failure (in slot order)
        is raised after all of them returned, with its slot marked as the culprit."""
        start = time.perf_counter()
        try:
            self._run_calls(calls)
        finally:
            self._tool_wall += time.perf_counter() - start

    def _run_calls(self, calls: list[tuple[Any, tuple[Any, ...], Slot]]) -> None:
        if self.environment_threads <= 1 or len(calls) <= 1:
            for function, args, slot in calls:
                self._current = slot
                function(*args)
            self._current = None
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.environment_threads, thread_name_prefix="dew-episodes"
            )
        futures = [(self._pool.submit(function, *args), slot) for function, args, slot in calls]
        concurrent.futures.wait([future for future, _ in futures])
        for future, slot in futures:
            error = future.exception()
            if error is not None:
                self._current = slot
                raise error

    def _config(self, tasks: Sequence[int], clocks: tuple[int, int]) -> dict[str, Any]:
        return {
            "rows": len(tasks),
            "groups": self.groups,
            "budgets": [self.max_prompt_tokens, self.max_new_tokens, self.max_turns],
            "sampling": dataclasses.asdict(self.sampling),
            "clocks": list(clocks),
            "estimator": self.estimator,
            "journal": self.journal is not None,
        }

    def _phase(self, work: Any, *args: Any) -> Any:
        """Run one phase; every rank then agrees on whether any of them failed."""
        error: BaseException | None = None
        result = None
        try:
            result = work(*args)
        except BaseException as err:
            error = err
        agree_on_failure(error)
        self._current = None
        return result

    def _open_all(
        self, slots: list[Slot], tasks: Sequence[int], clocks: Any, key: Any, variables: Any
    ) -> None:
        if self.journal is not None:
            budgets = [self.max_prompt_tokens, self.max_new_tokens, self.max_turns, self.groups]
            recover(self.journal, slots, tasks, clocks, key, variables, self.sampling, budgets)
        self._concurrently([(slot.open, (self.environment_factory,), slot) for slot in slots])
        for slot in slots:
            if not slot.running:
                self._current = slot
                self._finish(slot)

    def _truncate_rest(self, slots: list[Slot]) -> None:
        for slot in slots:
            if slot.running:
                self._current = slot
                self._finish(slot, EpisodeStatus.TRUNCATED, f"max_turns={self.max_turns} reached")

    def collect(self, variables: Any, tasks: Sequence[int], key: Any) -> list[Episode]:
        """Run one collection and return its episodes (slot order: task row, then sample)."""
        clocks = self._take_clocks()
        step, policy_step = clocks
        if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
            key = jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))
        agree_on_config(self._config(tasks, clocks))
        self._shards = shard_count(len(tasks)) if self.device_shards else 1
        self.policy.bind(local_variables(variables))
        origin = object()
        slots = draw_slots(tasks, self.groups, step, key, origin, self.journal)
        bar = TerminalBar("episodes", "episodes", enabled=self.progress)
        timings = {"generation": 0.0}
        start = time.perf_counter()
        self._current = None
        self._tool_wall = 0.0
        try:
            self._phase(self._open_all, slots, tasks, clocks, key, variables)
            for turn in range(self.max_turns):
                seconds = self._phase(self._round, slots, turn, key, policy_step)
                timings["generation"] += seconds
                done = sum(not s.running for s in slots)
                turns, tool = sum(s.turns for s in slots), sum(s.tool_seconds for s in slots)
                bar.update(done, len(slots), f"turns {turns}, tool {tool:.1f}s")
            self._phase(self._truncate_rest, slots)
        except BaseException as err:
            abort_collection(slots, self._current, err, self.record)
            raise AssertionError("unreachable") from err
        finally:
            bar.close()
        timings["tool"] = sum(s.tool_seconds for s in slots)
        timings["tool_wall"] = self._tool_wall
        timings["collection"] = time.perf_counter() - start
        self.last_timings = timings
        self.last_episodes = [s.episode() for s in slots]
        return self.last_episodes

    def __call__(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, Any]:
        """The Trainer hook: collect one cohort and return its packed GRPO batch."""
        tasks = task_ids(batch)
        episodes = self.collect(variables, tasks, key)
        start = time.perf_counter()
        size = len(episodes) // self._shards
        columns = []
        for shard in range(self._shards):
            part = episodes[shard * size : (shard + 1) * size]
            first_row = jax.process_index() * len(tasks) + shard * size // self.groups
            packed = project(
                part,
                [first_row + i // self.groups for i in range(len(part))],
                width=self.width,
                rows=len(part) * self.max_turns,
                estimator=self.estimator,
                eos_ids=self.sampling.eos_ids,
            )
            first = jax.process_index() * len(episodes) + shard * size  # cohort-wide numbers
            index = packed["session_index"]
            packed["session_index"] = np.where(index >= 0, index + first, -1).astype(np.int32)
            columns.append(packed)
        out = {name: np.concatenate([c[name] for c in columns]) for name in columns[0]}
        self.last_timings["pack"] = time.perf_counter() - start
        return out


__all__ = ["EpisodeRollout", "task_ids"]

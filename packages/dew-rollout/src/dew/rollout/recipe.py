"""The asynchronous rollout of ``dew train grpo`` and ``dew chain`` (``rollout.mode: async``).

``dew`` does not import ``dew.rollout``: it finds ``build_scheduler`` through the entry point
``async_rollout`` of the group ``dew.recipes`` (this distribution's ``pyproject.toml``) and
calls it with what the config resolved to. It builds, closing each through ``stack``:

- the rollout server: ``native``, Dew's continuous-batching ``Server`` on the policy's
  starting weights behind a ``NativeRolloutServer``, one slot per row; ``vllm`` or
  ``sglang``, ``dew.rollout.engines.engine_server`` (a running server at ``url``, or one
  started from ``launch``, its weights pushed by ``publish``);
- a ``PromptSource`` scoring each finished completion with the reward or, for tool episodes
  (``source: {kind: environment}``, on any of the engines), an ``EnvironmentSource``: each
  episode's turns are separate requests to the engine, its worker comes from
  ``environment(identity)`` and ``verifier(episode)`` scores it (the tasks are the batch's
  ``task_id`` rows; ``record(line, sessions)`` gets each training batch's record and
  admitted sessions);
- a ``RolloutScheduler`` with the section's schedule, its ``WeightJournal`` in
  ``RUN_DIR/rollout-journal`` (so a killed run resumes exactly: the batches that were in flight
  are redrawn under the weights they were submitted with) and one JSON line per training
  batch appended to ``RUN_DIR/rollout.jsonl`` (``SchedulerRecord.as_dict``: ``index``,
  ``updates``, ``version``, ``lag``, ``waited``, ``pushed``, ...).

When ``objective`` trains a LoRA adapter (``trained_adapter``), ``model`` is its
``LoraDecoder`` and ``params`` are ``{"params": adapter, "base": base}``. The engine is vLLM,
which serves the base and takes each push as an adapter (``engine_server(lora=)``), or the
native server, which serves the ``LoraDecoder`` unmerged (``NativeAdapterServer``): the base
stays the arrays it started with and each push swaps the adapter alone. Either way the
push's ``select`` picks the adapter, so the scheduler copies, pushes and journals only that.
SGLang is refused (``dew.rollout.engines``).

``rollout.adapt_ahead`` makes that scheduler's ``ahead`` an ``AdaptiveAhead`` starting at
``rollout.ahead`` (``schedule_ahead``); the source is sized for the most it may choose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from dew.rollout.native import NativeRolloutServer
from dew.rollout.native_adapter import NativeAdapterServer
from dew.rollout.scheduler.record import SchedulerRecord
from dew.rollout.scheduler.scheduler import RolloutScheduler
from dew.rollout.scheduler.staleness import AdaptiveAhead
from dew.rollout.scheduler.tasks import prompt_tasks, task_ids
from dew.rollout.sources.environment import EnvironmentSource
from dew.rollout.sources.prompt import PromptSource

#: The keys of ``build_scheduler``'s ``episodes``.
EPISODE_KEYS = ("environment", "verifier", "max_prompt_tokens", "max_turns")
#: Where the scheduler's journal and records go, under the run directory.
JOURNAL, RECORDS = "rollout-journal", "rollout.jsonl"


def _server(model: Any, params: Any, rollout: Any, sampling: Any, rows: int, seed: int,
            run_dir: str, stack: contextlib.ExitStack, lora: Any = None) -> Any:  # fmt: skip
    """The rollout server the ``engine`` section names, serving ``params`` as version 0
    (with ``lora``, a ``LoraConfig``: ``model`` a ``LoraDecoder`` and ``params`` its
    ``{"params": adapter, "base": base}``, served by a vLLM engine or, natively, by a
    ``NativeAdapterServer`` whose pushes carry the adapter alone)."""
    engine = rollout.engine
    if engine.kind == "native":
        from dew.inference import Server
        from dew.models.lora import LoraDecoder

        if lora is not None and not isinstance(model, LoraDecoder):
            raise ValueError(f"model: expected the LoraDecoder of the adapter objective, "
                             f"got {type(model).__name__}")  # fmt: skip
        core = Server(model, params, slots=rows, capacity=model.config.max_seq_len,
                      sampling=sampling, seed=seed)  # fmt: skip
        native = NativeAdapterServer if isinstance(model, LoraDecoder) else NativeRolloutServer
        server: Any = native(core)
        stack.callback(server.close)
        return server
    from dew.rollout.engines import engine_server

    # engine_server checks a launch mapping itself (resolving a virtualenv's interpreter)
    launch = None if engine.launch is None else dataclasses.asdict(engine.launch)
    return engine_server(engine.kind, url=engine.url, directory=engine.directory,
                         launch=launch, publish=engine.publish, model=model,
                         params=params, sampling=sampling, concurrency=rows, run_dir=run_dir,
                         stack=stack, nccl_library=engine.nccl_library, lora=lora)  # fmt: skip


def trained_adapter(objective: Any) -> Any:
    """The ``LoraConfig`` of an objective that trains an adapter (a ``LoraObjective``),
    else None."""
    from dew.models.lora import LoraConfig

    lora = getattr(objective, "lora", None)
    return lora if isinstance(lora, LoraConfig) else None


def _records(
    run_dir: str, stack: contextlib.ExitStack, scheduler: Any = None,
    record: Callable[[dict[str, Any], Any], None] | None = None,
) -> Callable[[SchedulerRecord], None]:  # fmt: skip
    """A scheduler ``log`` callback appending each line to ``RUN_DIR/rollout.jsonl``; with
    ``record``, also handing it the line and the batch's admitted sessions
    (``scheduler.last_sessions``, set before the scheduler logs the batch)."""
    os.makedirs(run_dir, exist_ok=True)
    out = stack.enter_context(open(os.path.join(run_dir, RECORDS), "a", encoding="utf-8"))

    def log(line: SchedulerRecord) -> None:
        entry = line.as_dict()
        out.write(json.dumps(entry, sort_keys=True) + "\n")
        out.flush()
        if record is not None:
            record(entry, scheduler.last_sessions)

    return log


def _source(server: Any, reward: Any, decode: Any, episodes: Mapping[str, Any] | None,
            max_new_tokens: int, sessions: int) -> Any:  # fmt: skip
    """A ``PromptSource`` (``episodes`` None) or an ``EnvironmentSource`` with a worker
    thread for each of ``sessions`` sessions in flight (re-grading with the verifier's
    ``regrade`` when it has one: ``source.regrade``)."""
    if episodes is None:
        return PromptSource(server, reward, max_new_tokens=max_new_tokens, decode=decode)
    make, verify = episodes["environment"], episodes["verifier"]
    return EnvironmentSource(server, lambda task, identity: make(identity),
                             lambda task, episode: verify(episode),
                             max_prompt_tokens=episodes["max_prompt_tokens"],
                             max_new_tokens=max_new_tokens, max_turns=episodes["max_turns"],
                             workers=sessions, regrade=getattr(verify, "regrade", None))  # fmt: skip


def schedule_ahead(rollout: Any) -> tuple[int | AdaptiveAhead, int]:
    """The scheduler's ``ahead`` for a ``RolloutConfig`` (an ``AdaptiveAhead`` starting at
    ``rollout.ahead`` with ``adapt_ahead``) and the most batches it may draw ahead."""
    adapt = rollout.adapt_ahead
    if adapt is None:
        return rollout.ahead, rollout.ahead
    chosen = AdaptiveAhead(adapt.target_wait, adapt.max_gap, start=rollout.ahead)
    return chosen, rollout.max_lag - rollout.sync_every + 1


def build_scheduler(
    *,
    objective: Any,
    model: Any,
    params: Any,
    reward: Callable[[str, str, str, str], Any] | None,
    decode: Callable[[Any], str] | None,
    rollout: Any,
    width: int,
    rows: int,
    groups: int,
    max_new_tokens: int,
    sampling: Any,
    eos_ids: tuple[int, ...] | None,
    estimator: str,
    seed: int,
    run_dir: str,
    stack: contextlib.ExitStack,
    progress: bool | None = None,
    episodes: Mapping[str, Any] | None = None,
    record: Callable[[dict[str, Any], Any], None] | None = None,
    correction: Any = None,
    dynamic_sampling: Any = None,
) -> RolloutScheduler:
    """The ``RolloutScheduler`` of a config's ``rollout`` section (see the module docstring).

    Args:
      objective: the ``GRPOObjective`` trained (rows ``width`` wide).
      model, params: the policy's decoder and its starting variables (served as version 0).
      reward, decode: the config's reward and ids -> text (None: ids separated by spaces);
        unused with ``episodes``.
      rollout: a ``dew.recipes.rollout_config.RolloutConfig`` in ``mode: async``.
      width: row width W; rows: rows N per step (prompts x groups); groups: samples per
        prompt (G); max_new_tokens: the response budget R (of each turn, for episodes).
      sampling: the ``dew.sampling.Sampling`` completions are drawn with.
      eos_ids: the ids that end a completion (None: none).
      estimator: the advantage estimator (``group``, ``mean`` or ``rloo``).
      seed: the run's seed; run_dir: where the journal and records go.
      stack: closes the server, the source, the records file and the scheduler (in the
        reverse order) when the run ends, fails or is interrupted.
      episodes: tool episodes instead of prompts, a mapping of ``environment`` (an
        ``EpisodeId`` -> environment, the tool-episode protocol), ``verifier`` (an
        ``Episode`` -> float), ``max_prompt_tokens`` (P) and ``max_turns`` (K); the batches
        then hold integer ``task_id`` rows. Every turn is one token-in, token-out draw
        from the engine, whichever it is (native, vLLM or SGLang).
      record: called after each training batch with its ``rollout.jsonl`` line (a dict) and
        the batch's admitted ``Session`` list (``scheduler.last_sessions``).
      correction: the stage's ``AdaptiveCorrection`` (adaptive TIS cap or IcePop band), or
        None; the scheduler measures each batch it packs.
      dynamic_sampling: the stage's ``DynamicSampling`` (DAPO's filter), or None; the
        scheduler's admission applies it.
    """
    if episodes is not None:
        episodes = {k: episodes[k] for k in EPISODE_KEYS}
    server = _server(model, params, rollout, sampling, rows, seed, run_dir, stack,
                     trained_adapter(objective))  # fmt: skip
    ahead, top = schedule_ahead(rollout)
    in_flight = rows // groups * (groups + rollout.oversample) * (top + 1)
    source = _source(server, reward, decode, episodes, max_new_tokens, in_flight)
    stack.callback(source.close)
    scheduler = RolloutScheduler(
        objective, source, server, width=width, rows=rows,
        tasks=prompt_tasks if episodes is None else task_ids, groups=groups,
        max_lag=rollout.max_lag, ahead=ahead, sync_every=rollout.sync_every,
        max_attempts=rollout.max_attempts, timeout=rollout.timeout,
        oversample=rollout.oversample, admit=rollout.admit, truncation=rollout.truncation,
        estimator=estimator, eos_ids=eos_ids, seed=seed,
        journal=os.path.join(run_dir, JOURNAL), progress=progress, correction=correction,
        dynamic_sampling=dynamic_sampling,
    )  # fmt: skip
    scheduler.log = _records(run_dir, stack, scheduler, record)
    stack.callback(scheduler.close)
    return scheduler


__all__ = ["EPISODE_KEYS", "JOURNAL", "RECORDS", "build_scheduler", "schedule_ahead",
           "trained_adapter"]  # fmt: skip

"""The rollout of a ``dew train grpo`` config with ``source: {kind: harbor}``.

``dew`` finds ``build_harbor_scheduler`` through the entry point ``harbor_rollout`` of the
group ``dew.recipes`` (``dew.recipes.harbor_run``) and calls it with the checked
``source`` section (``dew.recipes.harbor_config.HarborConfig``) and ``rollout`` section. It
builds, each closed through ``stack``:

- the engine: the one running at ``rollout.engine.url`` (serving
  ``rollout.engine.directory``, whose ``config.json`` must match the policy's shape; an
  engine that does not answer ``/v1/models`` is a ``ConfigError`` naming
  ``rollout.engine.url``), or one Dew launches (``rollout.engine.launch``) on the policy
  written to ``RUN_DIR/engine/policy``, with ``launch.tokenizer`` to render chats, serving
  the name the agents send (``source.model`` after any ``provider/`` prefix, and for vLLM
  the whole ``source.model`` as an alias), added to the
  gateway as a worker (``Gateway.add_worker``) and removed, then stopped, when the run ends;
- the weight push: ``SafetensorsReload`` of the policy into that directory, the policy
  pushed as version 0 before the first trial (a launched engine starts on it); a gateway
  that does not take the first stamp is a ``ConfigError`` naming ``source.gateway.url``;
- a ``SandboxProxy`` on ``source.sandbox_host`` in front of the gateway, and a ``Gateway``
  client whose agents' base URLs go through it;
- ``Publication(reload, stamp=gateway.stamp)``: a version is stamped on the gateway only
  after the engine serves it;
- a ``HarborSource`` (one ``harbor trial start`` per sample, trials under ``trials``),
  re-grading each trial with a reward by ``harbor trial regrade`` when ``source.regrade``
  is set (``HarborRegrade``; its counts join each record as ``regrade/*``);
- a ``RolloutScheduler`` over task ids, with the section's schedule, its journal in
  ``RUN_DIR/rollout-journal`` and one JSON line per training batch in
  ``RUN_DIR/rollout.jsonl`` (as ``dew.rollout.recipe``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from dew.recipes.schema import ConfigError
from dew.rollout.engines import check_directory, served_name, served_policy
from dew.rollout.gateway import Gateway, GatewayError
from dew.rollout.harbor import HarborSource
from dew.rollout.harbor_regrade import HarborRegrade
from dew.rollout.launch import launch_engine
from dew.rollout.proxy import SandboxProxy
from dew.rollout.publication import Publication
from dew.rollout.recipe import JOURNAL, _records, schedule_ahead
from dew.rollout.reload import SafetensorsReload
from dew.rollout.scheduler.scheduler import RolloutScheduler
from dew.rollout.scheduler.tasks import task_ids


def _launched(policy: Any, engine: Any, agent_model: str, gateway: Gateway, run_dir: str,
              stack: contextlib.ExitStack) -> tuple[str, Path]:  # fmt: skip
    """Launch the engine on ``policy`` serving what the agents ask for and route the gateway
    to it. A ``provider/name`` model is served as ``name`` (what a LiteLLM agent sends) and,
    by vLLM, also under the whole string (what an agent that does not strip it sends)."""
    name = agent_model.split("/", 1)[-1]
    names = (name, agent_model) if engine.kind == "vllm" and name != agent_model else (name,)
    folder = Path(run_dir) / "engine" / "policy"
    policy.save(folder, dtype="bfloat16")
    root = launch_engine(engine.kind, folder, run_dir=run_dir, stack=stack, launch=engine.launch,
                         max_model_len=policy.config.max_seq_len, dtype=policy.config.dtype,
                         served_name=names)  # fmt: skip
    try:
        worker = gateway.add_worker(root, name)
    except GatewayError as error:
        raise ConfigError(f"source.gateway.url: expected a running rllm-model-gateway that "
                          f"takes workers, got {gateway.url} ({error})") from None  # fmt: skip
    stack.callback(gateway.remove_worker, worker)
    return root, folder


def _publication(model: Any, params: Any, engine: Any, gateway: Gateway, agent_model: str,
                 run_dir: str, stack: contextlib.ExitStack) -> Publication:  # fmt: skip
    """Pushes to the engine, stamped on ``gateway``; the policy is version 0."""
    policy = served_policy(model, params, engine.kind)
    launched = engine.url is None  # else a running engine, which Dew never starts or stops
    if launched:
        root, folder = _launched(policy, engine, agent_model, gateway, run_dir, stack)
    else:
        folder = check_directory(engine.directory, policy)
        root = engine.url.rstrip("/")
    client = stack.enter_context(httpx.Client(base_url=root, timeout=300))
    if not launched:
        served_name(client, root)  # a running engine, or an error naming rollout.engine.url
    reload = SafetensorsReload(policy, folder, [root], engine.kind, client=client)
    try:  # construction stamps version 0 on the gateway
        publication = Publication(reload, version=0, stamp=gateway.stamp)
    except GatewayError as error:
        raise ConfigError(f"source.gateway.url: expected a running rllm-model-gateway, got "
                          f"{gateway.url} ({error})") from None  # fmt: skip
    if not launched:  # a launched engine already serves the policy it started with
        publication.load(policy.variables, 0)
    return publication


def build_harbor_scheduler(
    *,
    objective: Any,
    model: Any,
    params: Any,
    source: Any,
    rollout: Any,
    tasks: Mapping[int, str],
    trials: str,
    width: int,
    rows: int,
    groups: int,
    estimator: str,
    seed: int,
    run_dir: str,
    stack: contextlib.ExitStack,
    progress: bool | None = None,
) -> RolloutScheduler:
    """The ``RolloutScheduler`` of a config's Harbor ``source`` (module docstring).

    Args:
      objective: the ``GRPOObjective`` trained (rows ``width`` wide).
      model, params: the policy's decoder and its starting variables (pushed as version 0).
      source: the ``HarborConfig``; rollout: the ``RolloutConfig`` (``mode: async``, a vllm or
        sglang engine at ``url`` or launched).
      tasks: task id -> Harbor task directory; trials: where trials are written.
      width: row width W; rows: rows N per step (tasks x groups x chains); groups: trials
        per task; estimator: the advantage estimator.
      seed: the run's seed; run_dir: where the journal and records go.
      stack: closes the scheduler, records, source, gateway client, proxy and HTTP client
        (in that order) when the run ends, fails or is interrupted.
    """
    proxy = stack.enter_context(SandboxProxy(source.gateway.url, host=source.sandbox_host))
    gateway = Gateway(source.gateway.url, sandbox_url=proxy.url, timeout=source.gateway.timeout)
    stack.callback(gateway.close)
    publication = _publication(model, params, rollout.engine, gateway, source.model, run_dir,
                               stack)  # fmt: skip
    regrade = None
    if source.regrade is not None:
        regrade = HarborRegrade(**dataclasses.asdict(source.regrade))
    harbor = HarborSource(
        gateway, harbor=list(source.harbor), model=source.model, trials=trials,
        agent=source.agent, args=list(source.args), workers=source.workers,
        timeout=source.timeout, ready_timeout=source.ready_timeout, env=source.env,
        tasks={int(k): os.fspath(v) for k, v in tasks.items()}, regrade=regrade,
    )  # fmt: skip
    stack.callback(harbor.close)
    log = _records(run_dir, stack)
    scheduler = RolloutScheduler(
        objective, harbor, publication, width=width, rows=rows, tasks=task_ids, groups=groups,
        max_lag=rollout.max_lag, ahead=schedule_ahead(rollout)[0], sync_every=rollout.sync_every,
        max_attempts=rollout.max_attempts, timeout=rollout.timeout,
        oversample=rollout.oversample, admit=rollout.admit, truncation=rollout.truncation,
        estimator=estimator, seed=seed, log=log, journal=os.path.join(run_dir, JOURNAL),
        progress=progress,
    )  # fmt: skip
    stack.callback(scheduler.close)
    return scheduler


__all__ = ["build_harbor_scheduler"]

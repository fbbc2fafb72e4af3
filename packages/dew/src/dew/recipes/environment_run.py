"""A ``dew train grpo`` or ``dew train ppo`` run on tool episodes: ``source: {kind: environment}``.

``prepare_environment(config, stack)`` turns a checked config whose ``source`` is a
``SourceConfig`` into the pieces ``dew.recipes.train`` trains:

- the model, sized for contexts of ``P = source.max_prompt_tokens`` and turns of
  ``R = objective.max_new_tokens`` ids (``model.vocab_size`` is required unless the model is
  pretrained: the worker's ids have no other bound);
- ``GRPOObjective`` (grpo) or ``PPOObjective`` with its critic (ppo) over rows ``P + R``
  wide (``seq_len = P + R - 1``);
- the rollout: ``EpisodeRollout`` over ``TextGeneration``, ``objective.groups`` episodes per
  task and ``K = source.max_turns`` turns, each episode in its own worker process
  (``dew-sandbox``'s ``subprocess_environment``, found by entry point); for ppo wrapped in a
  ``PPORollout`` (GAE over each episode's actions, ``objective.gamma`` and ``lam``);
- the data: ``task_ids(tasks, batch, seed)``, batches of ``{"task_id": [B]}``;
- ``start``, run once the run directory is settled: it opens ``RUN_DIR/journal`` (an
  ``EpisodeJournal``, when ``source.journal``) and ``RUN_DIR/episodes.jsonl``, one line per
  finished episode (``step``, ``task``, ``sample``, ``status``, ``turns``, ``reward``,
  ``detail``; an episode replayed from the journal after a crash is written again).

With ``rollout.mode: async`` (grpo or ppo) ``dew.recipes.async_run.attach`` hands the
``EpisodeRollout``'s environment, verifier and budgets to ``dew-rollout``'s scheduler, which
runs the episodes on its engine one batch ahead of the update; ``EpisodeLog.batch`` then
writes ``episodes.jsonl`` (with each episode's ``version`` and ``lag``), and the scheduler's
``RUN_DIR/rollout-journal`` replaces the episode journal (``source.journal`` is not read).

With ``source.regrade`` episodes are scored again in a clean sandbox
(``dew.recipes.episode_regrade``): every rewarded session by the scheduler with
``rollout.mode: async`` (a rejected sample is drawn again), every completed episode by the
``EpisodeRollout`` with ``sync`` (a rejected episode becomes ``error``, masked from the
update); the counts ``regrade/*`` reach each log record.

The verifier ``outcome`` (``outcome_reward``) reads the worker's verdict: the ``detail`` of a
completed episode as a finite number. Episodes that did not complete (cut at a budget, an
error) are masked from the loss and the baseline whatever they score, and get 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dew.recipes.references import make_reward
from dew.recipes.schema import ConfigError
from dew.recipes.source_config import OUTCOME, SourceConfig
from dew.recipes.train_config import TrainConfig


def outcome_reward(episode: Any) -> float:
    """The reward the worker reported: a completed episode's ``detail`` as a number.

    Raises:
      ValueError: a completed episode whose detail is no finite number.
    """
    if str(episode.status) != "completed":
        return 0.0
    try:
        reward = float(episode.detail)
    except ValueError:
        reward = math.nan
    if not math.isfinite(reward):
        raise ValueError(
            f"source.verifier: {OUTCOME} reads the detail of a completed episode as its reward; "
            f"episode {episode.id} completed with detail {episode.detail!r}, not a finite number"
        )
    return reward


def task_ids(tasks: int, batch: int, seed: int) -> Any:
    """A ``dew.data.Dataset`` of ``{"task_id": [batch]}`` batches over ids ``0..tasks-1``:
    every epoch is its own permutation (drawn from ``seed`` and the epoch number), and batch
    ``i`` is positions ``[i * batch, (i + 1) * batch)`` of the endless stream of epochs, so a
    resumed run seeks straight to its position. Each process reads its share of the rows."""
    from dew.data import Dataset

    @functools.lru_cache(maxsize=4)
    def epoch(number: int) -> np.ndarray:
        return np.random.default_rng([seed, number]).permutation(tasks)

    def rows(index: int) -> np.ndarray:
        positions = range(index * batch, (index + 1) * batch)
        return np.asarray([epoch(p // tasks)[p % tasks] for p in positions], np.int64)

    def train(partition: Any, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        local = batch // partition.count
        for index in itertools.count(start):
            yield {"task_id": rows(index)[partition.index * local : (partition.index + 1) * local]}

    return Dataset(train=train, records=tasks, batch=batch)


class EpisodeLog:
    """The ``record`` callback appending to ``RUN_DIR/episodes.jsonl`` once ``open`` named it
    (episodes finished before that are not written); the file is created by the first
    episode and closed when ``stack`` closes."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.file: Any = None

    def open(self, path: str, stack: contextlib.ExitStack) -> None:
        self.path = path
        stack.callback(self.close)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.path = self.file = None

    def __call__(self, episode: Any) -> None:
        """One finished ``Episode`` of the trainer's own collection (mode sync)."""
        entry = {"step": episode.id.step, "task": episode.id.task, "sample": episode.id.sample,
                 "status": str(episode.status), "turns": len(episode.actions),
                 "reward": episode.reward, "detail": episode.detail}  # fmt: skip
        self._write(entry)

    def batch(self, line: Mapping[str, Any], sessions: Sequence[Any]) -> None:
        """The asynchronous run's record (``rollout.mode: async``): one line per admitted
        session (a ``dew.sessions.Session``) of the training batch ``line`` describes (its
        ``rollout.jsonl`` line), with the batch's ``step`` and ``index``, the session's
        ``version`` (the oldest weights any of its turns drew with) and ``lag`` (updates
        committed when it trained minus that version)."""
        for session in sessions:
            versions = [int(call.version) for call in session.calls]
            version = min(versions) if versions else int(line["updates"])
            self._write({"step": line["step"], "index": line["index"], "task": session.task,
                         "sample": session.sample, "status": str(session.status),
                         "turns": len(session.calls), "reward": session.reward,
                         "detail": session.detail, "version": version,
                         "lag": int(line["updates"]) - version})  # fmt: skip

    def _write(self, entry: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        if self.file is None:
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close)
        self.file.write(json.dumps(entry, sort_keys=True) + "\n")
        self.file.flush()


def episode_source(source: SourceConfig, where: str = "source") -> tuple[Any, Any]:
    """The worker factory (``dew-sandbox``'s, found by entry point) and the verifier of
    ``source``, both checked and neither started; errors name ``where.<key>``. With
    ``source.regrade`` the verifier is a ``RegradedVerifier`` (``dew.recipes.episode_regrade``)
    whose fleet ``start`` opens."""
    from dew.recipes.plugins import load_plugin
    from dew.recipes.train_data import on_path

    factory = load_plugin("subprocess_environment", f"{where}.kind", "dew-sandbox")
    args = {"command": list(source.command), "limits": source.limits, "env": source.env}
    try:
        environment = factory(args)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.{err}") from None
    if source.verifier == OUTCOME:
        verifier: Any = outcome_reward
    else:
        on_path()
        verifier = make_reward(source.verifier, f"{where}.verifier")
    if source.regrade is not None:  # scored again in a clean sandbox
        from dew.recipes.episode_regrade import regraded

        verifier = regraded(verifier, source.regrade, f"{where}.regrade")
    return environment, verifier


def _model(config: TrainConfig) -> tuple[Any, Any, int]:
    from dew.inference.compiled import bucket
    from dew.recipes.builder import build_model

    s, new = config.source, config.objective.max_new_tokens
    assert isinstance(s, SourceConfig)
    vocab = config.model.vocab_size
    if vocab is None and config.model.pretrained is None:
        raise ConfigError("model.vocab_size: required with source.kind environment (the "
                          "worker's token ids have no other bound), missing")  # fmt: skip
    room = bucket(s.max_prompt_tokens) + bucket(new)
    why = (f"source.max_prompt_tokens {s.max_prompt_tokens} + objective.max_new_tokens {new} "
           f"need ({room}; sampling pads each to a power of two, at least 16)")  # fmt: skip
    model, pretrained = build_model(config.model, vocab_size=vocab, max_seq_len=room,
                                    length_from=why)  # fmt: skip
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return model, pretrained, int(size or vocab or 0)


def _unused_reward(*args: Any) -> float:  # build_stage's prompt rollout, never called
    raise AssertionError("episodes are scored by source.verifier")


def prepare_environment(config: TrainConfig) -> dict[str, Any]:
    """The parts of a run on tool episodes, as ``dew.recipes.train.Prepared``'s keyword
    arguments: ``data``, ``objective``, ``rollout``, ``model``, ``vocab_size``, ``start``
    (see the module docstring). Nothing starts yet: the workers start with the episodes."""
    source, o, r = config.source, config.objective, config.run
    assert isinstance(source, SourceConfig)
    model, pretrained, vocab = _model(config)
    options = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("reward", "reward_args")}
    asynchronous = config.rollout is not None and config.rollout.is_async
    parts = episode_parts(source, model, options, pretrained=pretrained, batch=r.batch,
                          seed=r.seed, progress=r.progress, kind=config.kind,
                          asynchronous=asynchronous)  # fmt: skip
    return {**parts, "model": model, "vocab_size": vocab}


def episode_parts(
    source: SourceConfig,
    model: Any,
    options: Mapping[str, Any],
    *,
    pretrained: Any,
    batch: int,
    seed: int,
    progress: bool | None = None,
    where: str = "source",
    kind: str = "grpo",
    asynchronous: bool = False,
) -> dict[str, Any]:
    """``kind`` (grpo or ppo) on ``source``'s tool episodes for ``model``: ``data``
    (``task_ids``), ``objective`` (over rows ``source.max_prompt_tokens + max_new_tokens``
    wide), ``rollout`` and ``start(run_dir, stack)``, which opens the run directory's
    ``episodes.jsonl`` and, unless ``asynchronous`` (the scheduler keeps its own), the
    episode journal. ``options`` are ``build_stage``'s keys of ``kind`` (an ``eos_id`` is
    needed: it ends a turn); ``pretrained`` is the policy's start (the reference when
    ``beta > 0``). GRPO trains the ``EpisodeRollout`` directly; PPO wraps it in a
    ``PPORollout`` (``options``' ``gamma`` and ``lam``, else its defaults), which hands it the policy half
    of the variables and adds the critic's values and GAE targets. ``dew train`` and
    ``dew chain`` both build here."""
    from dew.inference import TextGeneration
    from dew.objectives.rl import EpisodeRollout
    from dew.recipes.shaping_config import KL_KEYS, SHAPING_KEYS, refuse_shaping
    from dew.recipes.stages import build_stage
    from dew.sampling import Sampling

    # a tool episode has no one completion to cut short; PPO charges the KL per action
    taken = KL_KEYS if kind == "ppo" else ()
    refuse_shaping(options, lambda key: f"{key} ({where})", "tool episodes take only the KL "
                   "keys, and only with kind ppo", tuple(k for k in SHAPING_KEYS if k not in taken))  # fmt: skip
    environment, verifier = episode_source(source, where)
    new = int(options.get("max_new_tokens", 16))
    objective, built = build_stage(kind, model, source.max_prompt_tokens + new, options,
                                   pretrained=pretrained, reward=_unused_reward)  # fmt: skip
    log = EpisodeLog()
    temperature = options.get("temperature")
    sampling = Sampling(temperature=1.0 if temperature is None else float(temperature),
                        top_k=options.get("top_k"), eos_id=options.get("eos_id"))  # fmt: skip
    episodes = EpisodeRollout(TextGeneration(model), environment, verifier,
                              source.max_prompt_tokens, new, source.max_turns,
                              options.get("groups", 4), sampling,
                              estimator=options.get("estimator", "group"), record=log,
                              progress=progress, regrade=None if asynchronous else
                              getattr(verifier, "regrade", None))  # fmt: skip
    rollout: Any = episodes
    if kind == "ppo":
        from dew.objectives.rl import PPORollout

        discount = {key: options[key] for key in ("gamma", "lam") if options.get(key) is not None}
        rollout = PPORollout(objective, episodes, **discount, kl_in_reward=built.kl_in_reward)

    def start(run_dir: str, run_stack: contextlib.ExitStack) -> None:
        log.open(os.path.join(run_dir, "episodes.jsonl"), run_stack)
        if callable(getattr(verifier, "open", None)):  # source.regrade's sandbox fleet
            verifier.open(run_stack)
        if source.journal and not asynchronous:  # the scheduler keeps its own journal
            from dew.objectives.rl import EpisodeJournal

            episodes.journal = EpisodeJournal(os.path.join(run_dir, "journal"))
            run_stack.callback(episodes.journal.close)
            run_stack.callback(setattr, episodes, "journal", None)

    data = task_ids(source.tasks, batch, seed)
    return {"data": data, "objective": objective, "rollout": rollout, "start": start}


__all__ = ["EpisodeLog", "episode_parts", "episode_source", "outcome_reward",
           "prepare_environment", "task_ids"]  # fmt: skip

"""The ``source`` section of a ``dew train grpo`` or ``ppo`` config: where the episodes come from.

``kind: prompts`` (the default, also when the section is left out) trains on the prompts of
``data.path``, one completion per sample. ``kind: environment`` trains on multi-turn tool
episodes against a worker process that speaks ``dew-sandbox``'s JSON-lines protocol
(``dew.sandbox.SubprocessEnvironment``)::

    source:
      kind: environment
      command: [python3, /abs/path/worker.py]   # the worker's argv (no shell)
      limits: {cpu_seconds: 30, deadline_seconds: 600}   # SandboxLimits keys, per episode
      env: {LEVEL: hard}        # extra environment variables for the worker
      tasks: 1000               # task ids 0..999, reshuffled every epoch by run.seed
      max_turns: 4              # model calls per episode (K)
      max_prompt_tokens: 64     # the longest context a turn may read (P)
      verifier: outcome         # or module:object, a function of an Episode
      journal: true             # RUN_DIR/journal: a killed run resumes its step exactly
      regrade:                  # optional: score each rewarded episode again
        command: [python3, verify.py]        # in a clean sandbox (dew-sandbox's keys:
        files: [answer.txt]                  # files, inputs, runner, workers, limits, ...)
        inputs: {verify.py: verify.py}

``command[0]`` is looked up on ``PATH`` (or, holding a ``/``, taken relative to the working
directory) and stored as an absolute path; a missing one is refused here, before anything
starts. The worker runs in a fresh temporary directory, so an argument naming an existing
file relative to the config file's directory (``dew.cli`` applies ``file_arguments``) or to
the working directory is stored as an absolute path; other arguments are passed as written.
``verifier: outcome`` scores an episode by the worker's own verdict: the
``detail`` of its final ``completed`` reply read as a number; ``module:object`` names a
function (or a class made with no arguments) taking a ``dew.rollouts.episodes.Episode``.

``regrade`` re-runs a verifier program on each rewarded episode's final artifact (the
``files`` of the worker's directory when the episode ends) in a fresh ``SandboxFleet`` job
directory that holds only those files and the ``inputs``; an episode whose clean reward
differs never trains (``dew.sessions.regrade``): with ``rollout.mode: async`` the scheduler
draws its sample again, with ``sync`` it becomes an ``error`` episode whose rows are masked.
Its keys are checked by ``dew-sandbox``'s ``sandbox_regrader``
(``dew.sandbox.regrade_recipe``); ``inputs`` paths are read relative to the config file's
directory.

``dew train ppo`` takes the same section: its episodes are wrapped in a ``PPORollout``
(``objective.gamma``, ``objective.lam``; a critic in the checkpoint).

With ``kind: environment`` a config has no ``data`` section (the tasks are the data), no
``objective.reward`` (the verifier scores) and needs ``objective.eos_id`` (the id that ends
a turn). ``dew train grpo`` or ``ppo`` (or a chain stage) with ``rollout.mode: async``
draws the episodes one batch ahead through ``dew-rollout``'s scheduler, each turn a
token-in, token-out draw from its engine (native, vLLM or SGLang); its journal
``RUN_DIR/rollout-journal`` then makes resumes exact, and ``journal`` is not read.

``kind: harbor`` trains on agent trials run by Harbor behind a recording gateway; its keys and
checks live in ``dew.recipes.harbor_config``.

``source_section(mapping, kind)`` checks the section against the whole config mapping and
returns a ``SourceConfig`` for ``environment``, None for ``prompts``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from typing import Any

from dew.checks import is_int
from dew.recipes.schema import ConfigError, section

SOURCE_KINDS = ("prompts", "environment", "harbor")
#: The ``dew train`` kinds (and ``dew chain`` stage kinds) that take ``kind: environment``.
SOURCE_TRAINERS = ("grpo", "ppo")
#: The keys only ``kind: environment`` reads.
ENVIRONMENT_KEYS = ("command", "limits", "env", "tasks", "max_turns", "max_prompt_tokens",
                    "verifier", "journal", "regrade")  # fmt: skip
#: The verifier that reads the worker's own verdict.
OUTCOME = "outcome"


def _count(value: Any, where: str) -> None:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{where}: expected an integer >= 1, got {value!r}")


def file_arguments(command: Any, base: str | os.PathLike[str]) -> Any:
    """``command`` with each relative argument that names an existing file under ``base``
    made absolute (``command[0]`` too when it holds a ``/``); anything else, and a
    ``command`` that is no list, is returned unchanged."""
    if not isinstance(command, list | tuple):
        return command
    out = list(command)
    for index, part in enumerate(out):
        if not isinstance(part, str) or os.path.isabs(part) or (index == 0 and "/" not in part):
            continue
        candidate = os.path.join(os.fspath(base), part)
        if os.path.isfile(candidate):
            out[index] = os.path.abspath(candidate)
    return out


def regrade_paths(regrade: Mapping[str, Any], base: str | os.PathLike[str]) -> dict[str, Any]:
    """``regrade`` with its ``inputs`` host paths read relative to ``base`` where such a file
    exists; anything else unchanged (its ``command`` runs in the job directory, where the
    inputs are, so its relative arguments stay as written)."""
    out = dict(regrade)
    inputs = out.get("inputs")
    if isinstance(inputs, Mapping):
        out["inputs"] = {name: file_arguments(["-", path], base)[1] if isinstance(path, str)
                         else path for name, path in inputs.items()}  # fmt: skip
    return out


def resolve_command(command: Any, where: str = "source.command") -> tuple[str, ...]:
    """``command`` (a nonempty list of strings) with its executable made absolute.

    Raises:
      ConfigError: not a list of strings, or no executable file by that name (looked up on
        ``PATH``, or relative to the working directory when it holds a ``/``).
    """
    if (
        not isinstance(command, list | tuple)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        raise ConfigError(f"{where}: expected a nonempty list of strings (an argv), got "
                          f"{command!r}")  # fmt: skip
    command = file_arguments(command, os.getcwd())
    program = command[0]
    if "/" in program:
        found = os.path.abspath(os.path.expanduser(program))
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            raise ConfigError(f"{where}: {program!r} is not an executable file")
    else:
        which = shutil.which(program)
        if which is None:
            raise ConfigError(f"{where}: no executable {program!r} on PATH")
        found = os.path.abspath(which)
    return (found, *command[1:])


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """A checked ``source`` section of kind ``environment`` (see the module docstring).

    ``limits`` and ``env`` are kept as given; ``dew-sandbox``'s factory checks them when the
    run starts (errors named ``source.limits.<key>``, ``source.env``).
    """

    kind: str = "prompts"
    command: Any = None
    limits: Any = None
    env: Any = None
    tasks: Any = None
    max_turns: int = 4
    max_prompt_tokens: int = 64
    verifier: str = OUTCOME
    journal: bool = True
    regrade: Any = None

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ConfigError(
                f"source.kind: expected one of {', '.join(SOURCE_KINDS)}, got {self.kind!r}"
            )
        if self.kind == "harbor":
            raise ConfigError("source.kind: a harbor section is read by "
                              "dew.recipes.harbor_config.harbor_section")  # fmt: skip
        if self.kind != "environment":
            return
        object.__setattr__(self, "command", resolve_command(self.command))
        for key in ("limits", "env", "regrade"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, Mapping):
                raise ConfigError(f"source.{key}: expected a mapping, got {value!r}")
            object.__setattr__(self, key, None if value is None else dict(value))
        if self.tasks is None:
            raise ConfigError("source.tasks: required, missing (how many task ids: 0..N-1)")
        for key in ("tasks", "max_turns", "max_prompt_tokens"):
            _count(getattr(self, key), f"source.{key}")
        if self.verifier != OUTCOME and self.verifier.count(":") != 1:
            raise ConfigError(
                f"source.verifier: expected {OUTCOME!r} or 'module:object', got {self.verifier!r}"
            )


def source_section(
    mapping: Mapping[str, Any], kind: str, *, stage: bool = False
) -> SourceConfig | None:
    """The ``source`` section of a config of ``kind`` (``mapping`` is the whole config):
    a ``SourceConfig`` for ``kind: environment``, None for ``prompts`` or no section
    (``kind: harbor`` is read by ``dew.recipes.harbor_config.harbor_section``).

    ``stage``: ``mapping`` is a ``dew chain`` stage, whose objective keys (``reward``,
    ``eos_id``, ...) sit in the stage itself rather than in an ``objective`` section.

    Raises:
      ConfigError: an unknown kind or key, a bad value, a key only ``environment`` reads
        given with ``prompts``, ``environment`` on another kind than grpo or ppo, or a section of the
        rest of the config that ``environment`` does not read (see the module docstring).
    """
    raw = mapping.get("source")
    if raw is None:
        return None
    config = section(SourceConfig, raw, "source")
    if config.kind == "prompts":
        for key in ENVIRONMENT_KEYS:
            if key in raw:
                raise ConfigError(f"source.{key}: only source.kind environment reads it (kind "
                                  "is prompts)")  # fmt: skip
        return None
    if kind not in SOURCE_TRAINERS:
        command = f"a grpo or ppo stage, not a {kind} one" if stage else f"'dew train grpo' " \
            f"or 'dew train ppo', not 'dew train {kind}'"  # fmt: skip
        raise ConfigError(f"source.kind: environment episodes train with {command}")
    _check_rest(mapping, stage)
    return config


def stage_source(spec: Mapping[str, Any], where: str, base: str | os.PathLike[str]) -> Any:
    """The checked ``source`` of the ``dew chain`` stage ``spec`` at ``where``
    (``stages.<i>``): a ``SourceConfig`` for ``kind: environment``, else None. The command's
    file arguments are read from ``base`` (the config file's directory) as ``dew train``
    reads them; every error names its key under ``where``."""
    raw = spec.get("source")
    if isinstance(raw, Mapping) and "command" in raw:
        raw = {**raw, "command": file_arguments(raw["command"], base)}
    if isinstance(raw, Mapping) and isinstance(raw.get("regrade"), Mapping):
        raw = {**raw, "regrade": regrade_paths(raw["regrade"], base)}
    try:
        return source_section({**spec, "source": raw}, spec.get("kind") or "grpo", stage=True)
    except ConfigError as err:
        raise ConfigError(f"{where}.{err}") from None


def check_source_stage(stage: Any) -> None:
    """Refuse a ``dew.recipes.chain.Stage`` with an environment ``source`` that has a dataset
    or a reward (the tasks are its data, the verifier scores) or no ``eos_id`` (it ends a
    turn).

    Raises:
      TypeError: ``stage.source`` is no ``SourceConfig`` of kind environment.
      ValueError: any of the above, naming the field and the stage.
    """
    name, source = stage.name, stage.source
    if not isinstance(source, SourceConfig) or source.kind != "environment":
        raise TypeError(f"Stage.source ({name}): expected a SourceConfig of kind environment, "
                        f"got {source!r}")  # fmt: skip
    for key, value in {"data": stage.data, "reward": stage.reward}.items():
        if value is not None:
            raise ValueError(
                f"Stage.{key} ({name}): a stage of environment episodes takes "
                "none (source.tasks are its data, source.verifier scores)"
            )
    if stage.eos_id is None:
        raise ValueError(f"Stage.eos_id ({name}): required with an environment source (the "
                         "id that ends a turn), missing")  # fmt: skip


def _check_rest(mapping: Mapping[str, Any], stage: bool = False) -> None:
    """Refuse what a config (or chain stage) of environment episodes does not read."""
    if mapping.get("data"):
        raise ConfigError("data: source.kind environment draws task ids from source.tasks and "
                          "reads no data section")  # fmt: skip
    objective = mapping if stage else mapping.get("objective") or {}
    prefix = "" if stage else "objective."
    if isinstance(objective, Mapping):
        for key in ("reward", "reward_args"):
            if objective.get(key) is not None:
                raise ConfigError(f"{prefix}{key}: source.kind environment scores episodes "
                                  "with source.verifier")  # fmt: skip
        if objective.get("eos_id") is None:
            raise ConfigError(f"{prefix}eos_id: required with source.kind environment (the "
                              "id that ends a turn), missing")  # fmt: skip


__all__ = ["ENVIRONMENT_KEYS", "OUTCOME", "SOURCE_KINDS", "SOURCE_TRAINERS", "SourceConfig",
           "check_source_stage", "file_arguments", "regrade_paths", "resolve_command",
           "source_section", "stage_source"]  # fmt: skip

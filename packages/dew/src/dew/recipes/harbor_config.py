"""The ``source`` section of kind ``harbor``: every sample one Harbor trial, scored by its verifier.

A ``dew train grpo`` config with this section trains on agent trials: ``dew-rollout``'s
``HarborSource`` runs one ``harbor trial start`` per sample, the agent reaches the policy
through a recording gateway (rllm-model-gateway) in front of the engine, and the trainer
learns from the calls the gateway recorded::

    source:
      kind: harbor
      tasks: tasks/              # a directory of Harbor task directories (each with task.toml)
      harbor: [harbor]           # the harbor command, as an argv prefix (no shell)
      agent: terminus-2          # Harbor's agent name or import path
      model: hosted_vllm/policy  # the model name the agent asks the gateway for
      args: []                   # further `harbor trial start` options
      env: {}                    # extra environment variables for each harbor process
      gateway: {url: "http://127.0.0.1:9090", timeout: 30}
      sandbox_host: 127.0.0.1    # where the sandbox proxy listens (reached by the trials)
      ready_timeout: 600         # seconds the first trial waits for the gateway to be ready
      trials: null               # where trials are written (null: RUN_DIR/trials)
      workers: 8                 # trials at once
      timeout: null              # seconds before a trial is killed (null: no limit)
      width: 4096                # packed row width W (objective seq_len W - 1)
      chains: 2                  # rows one trial may take (its calls split into chains)
      regrade: null              # or true, or a mapping: re-grade each trial with a reward

``regrade`` (``true`` for the defaults, or a mapping of ``tolerance``, ``tasks``,
``environment``, ``verifier_env``, ``args``, ``timeout``; ``HarborRegradeConfig``) re-grades
every trial that has a reward with ``harbor trial regrade`` in a separate verifier
environment that holds only the trial's recorded artifacts; a clean reward further than
``tolerance`` from the trial's, or a regrade that fails, drops the sample before admission.
The task that ``-p`` names (each trial's own, or the same-named one under ``regrade.tasks``)
must declare ``[verifier] environment_mode = "separate"`` (``dew.rollout.harbor_regrade``).

Task ``i`` is the ``i``-th task directory of ``tasks`` in name order; batches draw task ids
``0..T-1``, each epoch its own permutation by ``run.seed``. The run needs
``rollout.mode: async`` with a ``vllm`` or ``sglang`` engine behind the gateway, pushed by
``publish: reload``: either running (``rollout.engine.url`` the server the gateway forwards
to and ``directory`` the checkpoint it serves) or started by Dew (``launch``), which then
needs ``launch.tokenizer``, the tokenizer directory the engine renders the agents' chats
with. A launched engine serves the policy under the name the agents ask for
(``source.model`` without a ``provider/`` prefix). The run takes no ``data`` section
and no ``objective.reward`` (each task's verifier scores).

``harbor_section(mapping, kind)`` checks the section against the whole config mapping and
returns a ``HarborConfig``; every error is one line naming its key.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

from dew.checks import is_int
from dew.checks import tolerance as check_tolerance
from dew.recipes.schema import ConfigError, positive, section

#: The engines a gateway can forward chat completions to.
GATEWAY_ENGINES = ("vllm", "sglang")


def _count(value: Any, where: str) -> None:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{where}: expected an integer >= 1, got {value!r}")


def check_url(url: Any, where: str) -> str:
    """``url`` as an ``http(s)://host[:port]`` root without a trailing slash.

    Raises:
      ConfigError: not a string, another scheme, no host, a bad port, or a path, query or
        fragment after the root.
    """
    want = "an http(s) root URL such as 'http://127.0.0.1:9090'"
    if not isinstance(url, str):
        raise ConfigError(f"{where}: expected {want}, got {url!r}")
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if (parts.scheme not in ("http", "https") or not parts.hostname or not port_ok
            or parts.path or parts.query or parts.fragment):  # fmt: skip
        raise ConfigError(f"{where}: expected {want}, got {url!r}")
    return url.rstrip("/")


def task_directories(tasks: Any, where: str = "source.tasks") -> tuple[str, ...]:
    """The Harbor task directories (holding ``task.toml``) directly under ``tasks``, sorted
    by name, as absolute paths.

    Raises:
      ConfigError: ``tasks`` is no directory, or holds no task directory.
    """
    if not isinstance(tasks, str) or not os.path.isdir(os.path.expanduser(tasks)):
        raise ConfigError(f"{where}: expected a directory of Harbor task directories, got "
                          f"{tasks!r} (no such directory)")  # fmt: skip
    root = os.path.abspath(os.path.expanduser(tasks))
    found = tuple(
        os.path.join(root, name)
        for name in sorted(os.listdir(root))
        if os.path.isfile(os.path.join(root, name, "task.toml"))
    )
    if not found:
        raise ConfigError(f"{where}: expected Harbor task directories (each with task.toml) "
                          f"in {root}, found none")  # fmt: skip
    return found


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """``source.gateway``: the recording gateway Dew reads traces from (``url``, its root on
    an interface only the trainer reaches) and each request's ``timeout`` in seconds."""

    url: str
    timeout: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_url(self.url, "source.gateway.url"))
        positive(self.timeout, "source.gateway.timeout")


@dataclasses.dataclass(frozen=True)
class HarborRegradeConfig:
    """``source.regrade``: how each trial with a reward is re-graded (module docstring).

    ``tolerance``: the largest reward difference that agrees; ``tasks``: a task directory or
    a directory of them whose verifiers re-grade (null: each trial's own task; stored
    absolute); ``environment``: Harbor's ``-e`` for the verifier environment;
    ``verifier_env``: ``--ve`` variables; ``args``: further ``harbor trial regrade``
    options; ``timeout``: seconds before a regrade is killed (null: no limit).
    """

    tolerance: float = 0.0
    tasks: str | None = None
    environment: str | None = None
    verifier_env: Any = dataclasses.field(default_factory=dict)
    args: Any = ()
    timeout: float | None = None

    def __post_init__(self) -> None:
        where = "source.regrade"
        try:
            check_tolerance(self.tolerance, f"{where}.tolerance")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.tasks is not None:
            path = os.path.abspath(os.path.expanduser(self.tasks))
            if not os.path.isfile(os.path.join(path, "task.toml")):
                task_directories(self.tasks, f"{where}.tasks")
            object.__setattr__(self, "tasks", path)
        if self.environment == "":
            raise ConfigError(f"{where}.environment: expected Harbor's environment type, got ''")
        if not isinstance(self.verifier_env, Mapping) or not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str)
            for k, v in self.verifier_env.items()
        ):
            raise ConfigError(f"{where}.verifier_env: expected a mapping of names to strings, "
                              f"got {self.verifier_env!r}")  # fmt: skip
        object.__setattr__(self, "verifier_env", dict(self.verifier_env))
        if not isinstance(self.args, list | tuple) or not all(
            isinstance(a, str) for a in self.args
        ):
            raise ConfigError(f"{where}.args: expected a list of strings, got {self.args!r}")
        object.__setattr__(self, "args", tuple(self.args))
        positive(self.timeout, f"{where}.timeout")


def _regrade(value: Any) -> HarborRegradeConfig | None:
    """``source.regrade``: null or false (off), true (the defaults) or a mapping of keys."""
    if value is None or value is False:
        return None
    if value is True:
        return HarborRegradeConfig()
    if isinstance(value, Mapping | HarborRegradeConfig):
        return section(HarborRegradeConfig, value, "source.regrade")
    raise ConfigError(f"source.regrade: expected true, null or a mapping of re-grading keys, "
                      f"got {value!r}")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class HarborConfig:
    """A checked ``source`` section of kind ``harbor`` (see the module docstring).

    ``tasks`` is stored absolute; ``harbor`` with its executable made absolute (looked up
    on ``PATH``, or relative to the working directory when it holds a ``/``).
    """

    model: str
    gateway: Any
    tasks: str
    kind: str = "harbor"
    harbor: Any = ("harbor",)
    agent: str = "terminus-2"
    args: Any = ()
    env: Any = dataclasses.field(default_factory=dict)
    sandbox_host: str = "127.0.0.1"
    ready_timeout: float = 600.0
    trials: str | None = None
    workers: int = 8
    timeout: float | None = None
    width: int = 4096
    chains: int = 2
    regrade: Any = None

    def __post_init__(self) -> None:
        from dew.recipes.source_config import resolve_command

        if self.kind != "harbor":
            raise ConfigError(f"source.kind: expected 'harbor', got {self.kind!r}")
        if not self.model:
            raise ConfigError("source.model: expected the model name agents send, got ''")
        object.__setattr__(self, "tasks", os.path.dirname(task_directories(self.tasks)[0]))
        object.__setattr__(self, "harbor", resolve_command(self.harbor, "source.harbor"))
        if not isinstance(self.args, list | tuple) or not all(
            isinstance(a, str) for a in self.args
        ):
            raise ConfigError(f"source.args: expected a list of strings, got {self.args!r}")
        object.__setattr__(self, "args", tuple(self.args))
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ConfigError(f"source.env: expected a mapping of names to strings, got "
                              f"{self.env!r}")  # fmt: skip
        object.__setattr__(self, "env", dict(self.env))
        if isinstance(self.gateway, Mapping) or self.gateway is None:
            object.__setattr__(self, "gateway", section(GatewayConfig, self.gateway,
                                                        "source.gateway"))  # fmt: skip
        elif not isinstance(self.gateway, GatewayConfig):
            raise ConfigError(f"source.gateway: expected a mapping with url, got {self.gateway!r}")
        if not self.sandbox_host:
            raise ConfigError("source.sandbox_host: expected an address to listen on, got ''")
        positive(self.ready_timeout, "source.ready_timeout")
        positive(self.timeout, "source.timeout")
        for key in ("workers", "chains"):
            _count(getattr(self, key), f"source.{key}")
        if not is_int(self.width) or self.width < 2:
            raise ConfigError(f"source.width: expected an integer >= 2, got {self.width!r}")
        object.__setattr__(self, "regrade", _regrade(self.regrade))


def harbor_section(mapping: Mapping[str, Any], kind: str) -> HarborConfig:
    """The ``source`` section (``kind: harbor``) of a config of ``kind``; ``mapping`` is the
    whole config.

    Raises:
      ConfigError: an unknown key or bad value of the section, a kind other than grpo, a
        ``data`` section or ``objective.reward``, or a ``rollout`` that is not asynchronous
        on a vllm or sglang engine.
    """
    if kind != "grpo":
        raise ConfigError(f"source.kind: Harbor trials train with 'dew train grpo', not "
                          f"'dew train {kind}'")  # fmt: skip
    _check_rest(mapping)
    return section(HarborConfig, mapping.get("source"), "source")


def _check_rest(mapping: Mapping[str, Any]) -> None:
    """Refuse what a config of Harbor trials does not read or cannot run."""
    if mapping.get("data"):
        raise ConfigError("data: source.kind harbor draws task ids from source.tasks and reads "
                          "no data section")  # fmt: skip
    objective = mapping.get("objective") or {}
    if isinstance(objective, Mapping):
        for key in ("reward", "reward_args"):
            if objective.get(key) is not None:
                raise ConfigError(f"objective.{key}: source.kind harbor scores trials with "
                                  "each task's verifier")  # fmt: skip
    rollout = mapping.get("rollout") or {}
    if not isinstance(rollout, Mapping):
        return  # rollout_config names it
    mode = rollout.get("mode", "sync")
    if mode != "async":
        raise ConfigError(f"rollout.mode: source.kind harbor runs trials while the trainer "
                          f"updates and needs mode async, got {mode!r}")  # fmt: skip
    engine = rollout.get("engine") or {}
    engine_kind = engine.get("kind", "native") if isinstance(engine, Mapping) else None
    if not isinstance(engine, Mapping):
        return
    if engine_kind not in GATEWAY_ENGINES:
        raise ConfigError(f"rollout.engine.kind: source.kind harbor needs an engine behind the "
                          f"gateway ({' or '.join(GATEWAY_ENGINES)} at rollout.engine.url), got "
                          f"{engine_kind!r}")  # fmt: skip
    launch = engine.get("launch")
    if isinstance(launch, Mapping) and launch.get("tokenizer") is None:
        raise ConfigError("rollout.engine.launch.tokenizer: source.kind harbor's agents send "
                          "chats, which a launched engine renders with a tokenizer; expected "
                          "a tokenizer directory with a chat template, got none")  # fmt: skip
    if engine.get("publish", "reload") != "reload":
        raise ConfigError(f"rollout.engine.publish: source.kind harbor pushes weights by "
                          f"reload, got {engine.get('publish')!r}")  # fmt: skip


__all__ = ["GATEWAY_ENGINES", "GatewayConfig", "HarborConfig", "HarborRegradeConfig", "check_url",
           "harbor_section", "task_directories"]  # fmt: skip

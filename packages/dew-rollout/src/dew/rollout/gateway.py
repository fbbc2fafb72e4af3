"""`Gateway`: Dew's client of a recording gateway (rllm-model-gateway) that someone else runs.

A harness reaches the model through the gateway at `/sessions/<session>/v1`; the gateway
forwards each chat request to an engine (asking it for token ids and log-probs) and
stores a trace per call. `Gateway` checks that the gateway can serve (`ready`), labels
calls with the policy version (`stamp`), and reads a session's traces back as `Call`
records (`calls`), with the engine's own prompt ids, sampled ids and behavior
log-probabilities (see `dew.rollout.traces`).

Written against rllm-model-gateway 0.1.0 (PyPI, the wheel's `server.py`, `proxy.py`,
`data_process.py`, `session_router.py`), which has no authentication: the port that
proxies model calls also serves every session's traces and the admin routes. Keep `url`
on an interface only the trainer reaches and hand sandboxes `sandbox_url`, a
`dew.rollout.SandboxProxy` that forwards nothing but chat completions.

The version stamp. Later gateway revisions take `POST /admin/weight_version
{"weight_version": v}` and write the stamp held at arrival into each trace; 0.1.0 answers
that route 404. `stamp` posts it, and when the route is absent keeps the stamp in a
`StampLog` on this side instead, labelling each call by the time it reached the gateway
(the trace's `timestamp` minus its `latency_ms`; gateway and trainer share a host clock,
as the gateway runs beside the trainer). Either way the stamp is recorded only after the
caller (`Publication`) saw every replica serve the version.

An engine Dew starts itself joins the gateway through its admin routes (`add_worker`:
`POST /admin/workers {"url", "api_path", "model_name"}`; `remove_worker`: `DELETE
/admin/workers/<id>`), so the gateway may start with no worker at all.

Named errors: `GatewayNotReady` (no healthy worker, a dead one, `/v1/models` failing
through the gateway), `GatewayError` for a 500 or other failure answered by the gateway
(with the worker health when the gateway answers its plain-text 500), `MalformedTrace`.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

import httpx

from dew.rollout.errors import EngineError, EngineHTTPError, MalformedResponse
from dew.rollout.http import get_json, post_json, request_json
from dew.rollout.traces import MalformedTrace, StampLog, calls_from_traces
from dew.sessions.records import Call

SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class GatewayError(EngineError):
    """The gateway failed a request (HTTP error, no answer, unreadable body). `status`
    holds the HTTP status when there was one."""

    def __init__(self, message: str, url: str = "", status: int = 0) -> None:
        super().__init__(message, url)
        self.status = status


class GatewayNotReady(GatewayError):
    """The gateway did not report a healthy worker and answer `/v1/models` in time."""


def check_session(session: Any) -> str:
    """A session id that is safe in a URL path segment; refused by name otherwise."""
    if not isinstance(session, str) or SESSION_ID.fullmatch(session) is None:
        raise ValueError(
            "session: expected 1-128 characters of letters, digits, '_', '.' or '-', not "
            f"starting with '.' or '-', got {session!r}"
        )
    return session


class Gateway:
    """A running rllm-model-gateway at `url` (its root, e.g. `http://127.0.0.1:9090`).

    sandbox_url: the root sandboxes use instead (a `SandboxProxy`); `base_url(session)`
      builds harness base URLs from it. Defaults to `url` (only for harnesses that run
      outside any sandbox).
    timeout: seconds for each request Dew makes to the gateway.
    """

    def __init__(self, url: str, *, sandbox_url: str | None = None, timeout: float = 30.0) -> None:
        for name, value in (("url", url), ("sandbox_url", sandbox_url)):
            if value is None and name == "sandbox_url":
                continue
            parsed = urllib.parse.urlsplit(str(value))
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"{name}: expected an http(s) root URL, got {value!r}")
        self.url = url.rstrip("/")
        self.sandbox_url = (sandbox_url or url).rstrip("/")
        self.stamps = StampLog()
        self.stamping: str | None = None  # "gateway" or "local" after the first stamp
        self._client = httpx.Client(base_url=self.url, timeout=timeout)

    def base_url(self, session: str) -> str:
        """The OpenAI base URL a harness in a sandbox uses for `session`."""
        return f"{self.sandbox_url}/sessions/{check_session(session)}/v1"

    def _call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        try:
            return request_json(self._client, method, path, body, **kwargs)
        except EngineHTTPError as error:
            hint = ""
            if error.status == 500 and "Internal Server Error" in str(error):
                hint = self._worker_hint()
            raise GatewayError(f"{error}{hint}", "", error.status) from error
        except EngineError as error:
            raise GatewayError(str(error)) from error

    def _worker_hint(self) -> str:
        # a fresh connection: the gateway may close the one its 500 came on
        try:
            with httpx.Client(base_url=self.url, timeout=5) as client:
                health = get_json(client, "/health/workers")
            return (
                f" (the gateway reports {health.get('healthy')} of {health.get('total')} "
                "workers healthy; with none it answers every call with this plain 500)"
            )
        except (EngineError, AttributeError):
            return ""

    def workers(self) -> dict[str, Any]:
        """`GET /health/workers`: `{"workers": [...], "healthy": n, "total": n}`."""
        answer = self._call("GET", "/health/workers")
        if not isinstance(answer, dict) or not isinstance(answer.get("healthy"), int):
            raise GatewayError(
                f"/health/workers: expected an object with an integer 'healthy', got "
                f"{answer!r:.200}",
                self.url,
            )
        return answer

    def models(self) -> list[str]:
        """The model ids the engine lists, asked through the gateway (`GET /v1/models`)."""
        answer = self._call("GET", "/v1/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
            raise GatewayError(
                f"/v1/models: expected an object with a 'data' list, got {answer!r:.200}",
                self.url,
            )
        return [str(m.get("id")) for m in data]

    def ready(self, timeout: float = 60.0, *, interval: float = 0.5) -> None:
        """Wait until a worker is healthy and `/v1/models` answers through the gateway.

        Raises `GatewayNotReady` after `timeout` seconds, saying what failed last (a dead
        worker by URL, no worker, an HTTP error through the gateway)."""
        deadline = time.monotonic() + timeout
        problem = "nothing checked yet"
        while True:
            try:
                health = self.workers()
                if health["healthy"] < 1:
                    dead = [
                        str(w.get("url"))
                        for w in health.get("workers", [])
                        if isinstance(w, dict) and not w.get("healthy", False)
                    ]
                    problem = f"/health/workers: 0 of {health.get('total')} workers healthy" + (
                        f" (dead: {', '.join(dead)})" if dead else ""
                    )
                else:
                    models = self.models()
                    if models:
                        return
                    problem = "/v1/models through the gateway listed no model"
            except GatewayError as error:
                problem = str(error)
            if time.monotonic() >= deadline:
                raise GatewayNotReady(f"not ready after {timeout:g} s: {problem}", self.url)
            time.sleep(interval)

    def add_worker(self, url: str, model_name: str) -> str:
        """Route the gateway's calls to the engine at root `url` (its `/v1` API) serving
        `model_name`; returns the worker id for `remove_worker`."""
        answer = self._call("POST", "/admin/workers",
                            {"url": url.rstrip("/"), "api_path": "/v1", "model_name": model_name})  # fmt: skip
        worker = answer.get("worker_id") if isinstance(answer, dict) else None
        if not isinstance(worker, str) or not worker:
            raise GatewayError(
                f"/admin/workers: expected an object with a 'worker_id', got {answer!r:.200}",
                self.url,
            )
        return worker

    def remove_worker(self, worker: str) -> None:
        """Stop routing to the worker `add_worker` returned."""
        self._call("DELETE", f"/admin/workers/{urllib.parse.quote(worker, safe='')}")

    def stamp(self, version: int) -> None:
        """Label calls arriving from now on with `version` (`POST /admin/weight_version`;
        kept in `stamps` on this side when the gateway has no such route). Call it only
        once every replica serves `version`."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise TypeError(f"version: expected a nonnegative int, got {version!r}")
        try:
            answer = post_json(
                self._client, "/admin/weight_version", {"weight_version": version}, ok=(200,)
            )
        except EngineHTTPError as error:
            if error.status != 404:
                raise GatewayError(str(error), "", error.status) from error
            self.stamping = "local"
            self.stamps.record(version)
            return
        except MalformedResponse as error:
            raise GatewayError(str(error)) from error
        except EngineError as error:
            raise GatewayError(str(error)) from error
        if not isinstance(answer, dict) or answer.get("weight_version") != version:
            raise GatewayError(
                f"/admin/weight_version: expected {{'weight_version': {version}}}, got "
                f"{answer!r:.200}",
                self.url,
            )
        self.stamping = "gateway"
        self.stamps.record(version)

    def traces(self, session: str) -> list[Any]:
        """The raw traces of `session` (`GET /sessions/<session>/traces`)."""
        answer = self._call("GET", f"/sessions/{check_session(session)}/traces")
        if not isinstance(answer, list):
            raise MalformedTrace(
                f"session {session!r}: expected a JSON list of traces, got {answer!r:.200}",
                self.url,
            )
        return answer

    def calls(self, session: str) -> list[Call]:
        """The calls of `session` in arrival order, each with the stamp it arrived under."""
        return calls_from_traces(self.traces(session), session=session, stamps=self.stamps)

    def delete(self, session: str) -> None:
        """Drop `session`'s traces from the gateway's store."""
        self._call("DELETE", f"/sessions/{check_session(session)}")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

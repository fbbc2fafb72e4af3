"""`SandboxProxy`: the only door from a sandbox to the recording gateway.

rllm-model-gateway serves, on the one port that proxies model calls, every session's
traces (`GET /sessions/...`, `POST /traces/query`), session deletes and its admin routes
(`/admin/workers` registers a worker, `/admin/weight_version` moves the stamp). A
sandbox runs the policy's commands, so it must reach none of those. This proxy, started
by Dew on an address the sandboxes can reach, forwards exactly one thing:

    POST /sessions/<session>/v1/chat/completions   (no query string)

with `<session>` a plain id (letters, digits, `_`, `.`, `-`; no `%`-escapes, no `..`), the
body passed through unchanged (at most `max_body` bytes, sent with a Content-Length) and
only the `Content-Type` and `Accept` headers kept. Every other path answers 404 and every
other method on that path 405, without contacting the gateway. Answers are relayed as
they arrive, so a streamed (SSE) completion streams through.

Sandbox network allowlists (Harbor's `network_mode = "allowlist"`) filter hosts, not
paths: point them at this proxy and keep the gateway's own port unreachable.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from dew.rollout.gateway import SESSION_ID

ROUTE = re.compile(r"/sessions/(" + SESSION_ID.pattern + r")/v1/chat/completions")
KEPT_HEADERS = ("content-type", "accept")


class SandboxProxy:
    """Forward sandboxes' chat completions to `gateway_url`, refuse everything else.

    host, port: where to listen (port 0 picks a free one; `url` says which).
    max_body: the largest request body forwarded, in bytes (413 above it).
    timeout: seconds to wait on the gateway per read (None: no limit, as a long agent
      turn may need).
    """

    def __init__(
        self,
        gateway_url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = 16 << 20,
        timeout: float | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(gateway_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"gateway_url: expected an http(s) root URL, got {gateway_url!r}")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ValueError(f"max_body: expected a positive int of bytes, got {max_body!r}")
        self.gateway_url = gateway_url.rstrip("/")
        self.max_body = max_body
        self.refused = 0
        self.forwarded = 0
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection; a body ends at close

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_POST

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        address = self._server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dew-sandbox-proxy", daemon=True
        )
        self._thread.start()

    def _refuse(self, handler: BaseHTTPRequestHandler, status: int, message: str) -> None:
        with self._lock:
            self.refused += 1
        data = json.dumps({"error": message}).encode()
        handler.send_response(status)
        if status == 405:
            handler.send_header("Allow", "POST")
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        match = ROUTE.fullmatch(handler.path)
        if match is None:
            self._refuse(handler, 404, "only POST /sessions/<session>/v1/chat/completions")
            return
        if handler.command != "POST":
            self._refuse(handler, 405, f"{handler.command} is not forwarded; only POST")
            return
        length = handler.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._refuse(handler, 411, "a Content-Length is required")
            return
        if int(length) > self.max_body:
            self._refuse(handler, 413, f"body of {length} bytes exceeds {self.max_body}")
            return
        body = handler.rfile.read(int(length))
        headers = {k: v for k, v in handler.headers.items() if k.lower() in KEPT_HEADERS}
        target = f"{self.gateway_url}/sessions/{match.group(1)}/v1/chat/completions"
        started = False
        try:
            with self._client.stream("POST", target, content=body, headers=headers) as answer:
                started = True
                handler.send_response(answer.status_code)
                kind = answer.headers.get("content-type")
                if kind:
                    handler.send_header("Content-Type", kind)
                handler.end_headers()
                for chunk in answer.iter_raw():
                    handler.wfile.write(chunk)
                    handler.wfile.flush()
        except httpx.HTTPError as error:
            if started:
                return  # the gateway broke off mid-answer; the sandbox sees a short body
            data = json.dumps({"error": f"gateway unreachable: {error!r}"}).encode()
            try:
                handler.send_response(502)
                handler.send_header("Content-Type", "application/json")
                handler.end_headers()
                handler.wfile.write(data)
            except OSError:
                pass
            return
        except OSError:
            return  # the sandbox hung up
        with self._lock:
            self.forwarded += 1

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def __enter__(self) -> SandboxProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

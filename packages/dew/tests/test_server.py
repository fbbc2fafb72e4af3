"""Server: continuous batching, reloads with versions, refusals, errors and threads."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.inference import RequestTooLarge, Server
from dew.models import load_pretrained
from dew.sampling import Sampling

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"
PROMPTS = [[5, 17, 99, 3, 42], [7, 1, 2, 3, 4, 5, 6, 8, 9], [100, 101, 102]]


@pytest.fixture(scope="module")
def pretrained():
    return load_pretrained(FIXTURES / "qwen3_tied")


@pytest.fixture(scope="module")
def greedy_server(pretrained):
    return Server(pretrained.model, pretrained.variables, slots=2, capacity=48, steps_per_call=3)


def test_greedy_matches_transformers_with_join_and_leave(greedy_server):
    recorded = np.load(FIXTURES / "qwen3_tied.npz")
    budgets = [10, 4, 10]
    ids = [greedy_server.submit(p, b) for p, b in zip(PROMPTS, budgets)]
    assert greedy_server.pending == 3
    first = greedy_server.step()  # two requests admitted, one waits for a slot
    # the budget-4 request ends in the first round (1 prefill token + 3 decode steps)
    assert [c.request_id for c in first] == [ids[1]] and greedy_server.free_slots == 1
    done = {**{c.request_id: c for c in first}, **greedy_server.run()}
    expected = [row[:n].tolist() for row, n in zip(recorded["greedy"], recorded["greedy_lengths"])]
    for rid, want, budget in zip(ids, expected, budgets):
        assert done[rid].ids.tolist() == want[:budget]
        assert done[rid].finish_reason == "length"
        assert np.all(done[rid].behavior_log_probs == 0.0)
    assert greedy_server.free_slots == 2 and greedy_server.pending == 0


def test_no_recompiles_for_new_lengths_in_bucket(greedy_server):
    greedy_server.submit([1, 2], 3)
    greedy_server.run()
    before = greedy_server.compile_count
    for n in (1, 4, 7, 13, 16):
        greedy_server.submit(list(range(1, n + 1)), 5)
    greedy_server.run()
    assert greedy_server.compile_count == before  # admit n=1, n=2 and decode already built


def test_sampling_is_per_request_and_matches_rescoring(pretrained):
    sampling = Sampling(temperature=0.9, top_k=7, return_support=True, eos_id=3)
    wide = Server(pretrained.model, pretrained.variables, slots=4, capacity=48, sampling=sampling)
    narrow = Server(pretrained.model, pretrained.variables, slots=1, capacity=48, sampling=sampling)
    a = [wide.submit(p, 12, seed=11 + i) for i, p in enumerate(PROMPTS)]
    b = [narrow.submit(p, 12, seed=11 + i) for i, p in enumerate(PROMPTS)]
    ra, rb = wide.run(), narrow.run()
    for i, j, prompt in zip(a, b, PROMPTS):
        assert ra[i].ids.tolist() == rb[j].ids.tolist()
        got = ra[i]
        assert got.support.shape == (len(got.ids), 7)
        assert got.eos == (got.ids[-1] == 3)
        chain = jnp.array([prompt + got.ids.tolist()])
        logits = pretrained.model.apply(pretrained.variables, chain)[0, len(prompt) - 1 : -1]
        raw = jax.nn.log_softmax(logits)[jnp.arange(len(got.ids)), got.ids]
        np.testing.assert_allclose(got.raw_log_probs, raw, atol=2e-5)
        assert np.all(got.behavior_log_probs <= 0)
        assert np.all((got.support == got.ids[:, None]).any(axis=1))


def test_reload_between_steps_casts_and_versions(pretrained):
    server = Server(
        pretrained.model,
        pretrained.variables,
        slots=2,
        capacity=48,
        steps_per_call=2,
        dtype="bfloat16",
    )
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(server.variables))
    rid = server.submit(PROMPTS[0], 9)
    server.step()  # first token + two decoded tokens on version 0
    changed = jax.tree.map(lambda x: x * 1.5, pretrained.variables)
    assert server.reload(changed, version=7) == 7
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(server.variables))
    late = server.submit(PROMPTS[1], 2)
    done = server.run()
    versions = done[rid].versions.tolist()
    assert versions[:3] == [0, 0, 0] and set(versions[3:]) == {7} and len(versions) == 9
    assert done[rid].submitted_version == 0 and done[late].submitted_version == 7
    with pytest.raises(ValueError, match="variables"):
        server.reload({"params": {"other": jnp.zeros(3)}})
    assert server.version == 7
    assert server.reload(pretrained.variables) == 8


def test_refusals_do_not_take_slots(greedy_server):
    free, pending = greedy_server.free_slots, greedy_server.pending
    with pytest.raises(RequestTooLarge, match="capacity of 48"):
        greedy_server.submit(list(range(40)), 9)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_server.submit([1], 0)
    with pytest.raises(ValueError, match="prompt_ids"):
        greedy_server.submit([], 3)
    assert (greedy_server.free_slots, greedy_server.pending) == (free, pending)


def test_program_error_frees_slots_and_server_recovers(pretrained):
    server = Server(pretrained.model, pretrained.variables, slots=2, capacity=32, steps_per_call=2)
    a = server.submit([1, 2, 3], 6)
    server.step()
    original = server.programs.get

    def broken(key, build, args, donate_argnums=()):
        if key[0] == "decode":
            raise RuntimeError("device lost")
        return original(key, build, args, donate_argnums)

    server.programs.get = broken  # type: ignore[method-assign]
    b = server.submit([4, 5], 6)
    failed = {c.request_id: c for c in server.step()}
    assert set(failed) == {a, b}
    assert all(
        c.finish_reason == "error" and "device lost" in str(c.error) for c in failed.values()
    )
    assert server.free_slots == 2 and server.pending == 0
    server.programs.get = original  # type: ignore[method-assign]
    c = server.submit([1, 2, 3], 4)
    assert server.run()[c].ids.shape == (4,)


def test_cancel_before_admission_still_calls_back(greedy_server):
    seen = []
    a = greedy_server.submit([1, 2, 3], 5, callback=seen.append)
    assert greedy_server.cancel(a)
    done = greedy_server.run()
    assert done[a].finish_reason == "cancelled" and len(done[a].ids) == 0
    assert [(x.request_id, x.finish_reason) for x in seen] == [(a, "cancelled")]


def test_cancel_and_callbacks(greedy_server):
    seen = []
    a = greedy_server.submit([1, 2, 3], 20, callback=seen.append)
    b = greedy_server.submit([4, 5], 20)
    c = greedy_server.submit([6], 20)
    greedy_server.step()
    assert greedy_server.cancel(a) and greedy_server.cancel(c)
    assert not greedy_server.cancel(12345)
    done = greedy_server.run()
    assert done[a].finish_reason == "cancelled" and 0 < len(done[a].ids) < 20
    assert done[c].finish_reason == "cancelled" and len(done[c].ids) == 0
    assert done[b].finish_reason == "length" and len(done[b].ids) == 20
    assert [x.request_id for x in seen] == [a]
    assert greedy_server.free_slots == 2

    def explode(completion):
        raise RuntimeError("callback bug")

    d = greedy_server.submit([1, 2], 2, callback=explode)
    e = greedy_server.submit([1, 2], 2, callback=seen.append)
    done = greedy_server.run()
    assert done[d].finish_reason == "length" and seen[-1].request_id == e


def test_submit_from_other_threads(greedy_server):
    results: dict[int, object] = {}
    finished = threading.Event()
    stop = threading.Event()

    def drive():
        while not stop.is_set():
            if not greedy_server.step():
                stop.wait(0.001)

    def record(completion):
        results[completion.request_id] = completion
        if len(results) == 4:
            finished.set()

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        submitters = [
            threading.Thread(
                target=greedy_server.submit, args=([i + 1, i + 2], 5), kwargs={"callback": record}
            )
            for i in range(4)
        ]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
        assert finished.wait(120)
    finally:
        stop.set()
        thread.join()
    assert all(len(c.ids) == 5 for c in results.values())


def test_from_task(pretrained):
    task = SimpleNamespace(
        model=pretrained.model, variables=pretrained.variables, sampling=Sampling(temperature=0.0)
    )
    server = Server.from_task(task, slots=1, capacity=24)
    assert server.sampling.greedy and server.slots == 1
    with pytest.raises(TypeError, match="task"):
        Server.from_task(SimpleNamespace(model=pretrained.model), slots=1)


def test_attention_window_buckets_keep_greedy_tokens(pretrained):
    """A capacity much larger than the live rows: decode attends over a small window."""
    recorded = np.load(FIXTURES / "qwen3_tied.npz")
    server = Server(
        pretrained.model,
        pretrained.variables,
        slots=3,
        capacity=128,
        min_window=8,
        steps_per_call=4,
    )
    ids = [server.submit(p, 10) for p in PROMPTS]
    done = server.run()
    expected = [row[:n].tolist() for row, n in zip(recorded["greedy"], recorded["greedy_lengths"])]
    assert [done[i].ids.tolist() for i in ids] == expected
    windows = sorted(key[1] for key in server.programs._programs if key[0] == "decode")
    assert windows == [16, 32]  # longest row: 9 prompt + up to 10 generated ids

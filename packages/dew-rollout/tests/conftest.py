"""dew-rollout test setup: JAX on CPU, the tiny policy, and a real vLLM engine.

The `vllm_engine` fixture starts one vLLM CPU engine per test session (startup takes
two to three minutes) over a checkpoint `SafetensorsReload.write` produced, on all CPUs
but one (`engine_cpus`), so the tests keep a core while it decodes. It serves what every
module using it needs: token-id prompts and weight pushes, chats (it loads the tiny
model's chat tokenizer, `rollout_engine.chat_tokenizer`) and run-time LoRA adapters up to
rank `LORA_RANK`. The modules share its state, so each pushes the weights it starts from.
When the engine's virtualenv is missing it skips with the reason (under ``CI=true`` the
skip is a failure); when it is present but the engine fails to start, the tests fail with
the engine's log.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from rollout_engine import (  # noqa: E402
    LORA_RANK,
    VLLMEngine,
    chat_tokenizer,
    engine_cpus,
    tiny_pretrained,
    vllm_python,
)
from rollout_fakes import FakeSGLang, FakeVLLM  # noqa: E402
from rollout_tiny import Tiny, build_tiny  # noqa: E402

from dew.models import Pretrained  # noqa: E402
from dew.rollout import SafetensorsReload  # noqa: E402


@pytest.fixture(scope="session")
def pretrained() -> Pretrained:
    return tiny_pretrained()


@pytest.fixture(scope="session")
def tiny() -> Tiny:
    """The tiny decoder and its served cores (rollout_tiny.py), built once."""
    return build_tiny()


@pytest.fixture
def fake_vllm() -> Iterator[FakeVLLM]:
    engine = FakeVLLM()
    yield engine
    engine.close()


@pytest.fixture
def fake_sglang() -> Iterator[FakeSGLang]:
    engine = FakeSGLang()
    yield engine
    engine.close()


@dataclass
class LiveEngine:
    """The session engine, the full-weight push to it, and the checkpoint folder it serves
    (pushes rewrite it)."""

    engine: VLLMEngine
    reload: SafetensorsReload
    directory: Path


@pytest.fixture(scope="session")
def vllm_env_python() -> Path:
    """The python of the real vLLM engine's virtualenv. Without one a test skips saying why,
    or fails under ``CI=true`` (the root conftest), where the engine must have been built."""
    python, reason = vllm_python()
    if python is None:
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def vllm_engine(
    vllm_env_python: Path, pretrained: Pretrained, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveEngine]:
    python = vllm_env_python
    root = tmp_path_factory.mktemp("vllm")
    directory = root / "policy"
    placeholder = SafetensorsReload(pretrained, directory, ["http://127.0.0.1:1"])
    placeholder.write()
    tokenizer = chat_tokenizer(root / "tokenizer")
    engine = VLLMEngine(python, directory, root, cpus=engine_cpus(), tokenizer=tokenizer,
                        lora_rank=LORA_RANK)  # fmt: skip
    reload = SafetensorsReload(pretrained, directory, [engine.url], "vllm", timeout=120)
    try:
        yield LiveEngine(engine, reload, directory)
    finally:
        reload.close()
        placeholder.close()
        engine.close()

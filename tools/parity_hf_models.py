"""Record tiny Hugging Face decoder checkpoints and transformers' outputs on them.

Run with the reference interpreter (torch 2.13.0 CPU, transformers 5.x):

    $(tools/reference_env.sh) tools/parity_hf_models.py

For each case it builds a small random model with transformers, randomises the
norm scales (and Qwen2 biases) so every tensor matters, saves it with
`save_pretrained` under tests/fixtures/models/<case>/, and writes
tests/fixtures/models/<case>.npz holding:

* ids [2, 12] and logits [2, 12, V] (float32) of the full forward;
* greedy generations from three prompts of different lengths, batch 1 each,
  `generate(do_sample=False, max_new_tokens=10)`, once without EOS and once
  with an EOS id chosen from the first run so that it stops early.

The Mistral case has a 4-token sliding window, a third of the 12 scored
tokens, and its generations run to 19 tokens, so the window hides keys in both
the scored forward and the cached decoding; for it the recorder also checks
that `generate` with its cache agrees with greedy decoding that recomputes the
whole sequence at every step without a cache, and stores decode_ids [1, 19]
(the longest prompt and its greedy continuation) with their logits
decode_logits [1, 19, V] from one uncached forward.

Then it checks that what Dew's `Pretrained.save` writes reloads in transformers:
the workspace interpreter loads each checkpoint with `dew.models.load_pretrained`
and saves it (float32, one case sharded), transformers reads that copy and
scores the same ids. Those logits go, one array per case, into
tests/fixtures/models/dew_saves.npz, for the tests to compare with the logits
Dew computes itself; the saved file names and the largest difference from the
original checkpoint's logits go into the JSON sidecar
tests/fixtures/models/models.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "models"
WORKSPACE_PYTHON = ROOT / ".venv" / "bin" / "python"
BASE = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
CASES = {
    "qwen3_tied": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(BASE, intermediate_size=96, head_dim=16, rope_theta=12345.0, tie_word_embeddings=True),
        None,
    ),
    "qwen3_untied_sharded": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(BASE, intermediate_size=96, head_dim=24, rope_theta=1e6, tie_word_embeddings=False),
        "40KB",
    ),
    "llama3_untied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            BASE,
            intermediate_size=160,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        None,
    ),
    "llama_linear_tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            BASE,
            intermediate_size=128,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 2000.0, "factor": 2.0},
        ),
        None,
    ),
    "qwen2_tied": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(BASE, intermediate_size=96, rope_theta=30000.0, tie_word_embeddings=True),
        None,
    ),
    "mistral_sliding": (
        MistralConfig,
        MistralForCausalLM,
        dict(
            BASE,
            intermediate_size=96,
            sliding_window=4,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        ),
        None,
    ),
}
PROMPTS = ([5, 17, 99, 3, 42], [7, 1, 2, 3, 4, 5, 6, 8, 9], [100, 101, 102])
NEW_TOKENS = 10


def build(case: str, seed: int) -> torch.nn.Module:
    config_cls, model_cls, kwargs, _ = CASES[case]
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.05)
            elif param.dim() == 2:
                param.normal_(0.0, 0.08)
    return model


def logits_of(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def greedy(model: torch.nn.Module, eos: int | None) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=eos,
                pad_token_id=0,
            )
        out.append(tokens[0, len(prompt) :].tolist())
    return out


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    """`np.savez_compressed`, unless `path` already holds exactly these arrays.

    A zip member carries the time it was written, so re-saving equal arrays
    would still change the file; keeping it leaves unchanged fixtures alone.
    """
    if path.exists():
        with np.load(path) as old:
            same = set(old.files) == set(arrays) and all(
                old[k].dtype == v.dtype and np.array_equal(old[k], v) for k, v in arrays.items()
            )
        if same:
            return
    np.savez_compressed(path, **arrays)


def greedy_without_cache(model: torch.nn.Module) -> list[list[int]]:
    """The same greedy continuations, each step a full forward with no cache."""
    out = []
    for prompt in PROMPTS:
        tokens = list(prompt)
        for _ in range(NEW_TOKENS):
            with torch.no_grad():
                logits = model(torch.tensor([tokens]), use_cache=False).logits
            tokens.append(int(logits[0, -1].argmax()))
        out.append(tokens[len(prompt) :])
    return out


def pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    arr = np.full((len(rows), width), -1, np.int32)
    for i, r in enumerate(rows):
        arr[i, : len(r)] = r
    return arr, np.array([len(r) for r in rows], np.int32)


DEW_SAVE = """
import sys
from dew.models import load_pretrained
src, dst, shard = sys.argv[1], sys.argv[2], sys.argv[3]
p = load_pretrained(src)
p.save(dst, dtype="float32", max_shard_bytes=int(shard) if shard != "0" else None)
"""


def dew_roundtrip(case: str, ids: np.ndarray, reference: np.ndarray) -> tuple[dict, np.ndarray]:
    """Save `case` with Dew, score `ids` with transformers on that copy: (record, logits)."""
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "saved"
        shard = "30000" if case.endswith("sharded") else "0"
        subprocess.run(
            [str(WORKSPACE_PYTHON), "-c", DEW_SAVE, str(OUT / case), str(dst), shard],
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        reloaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
        got = logits_of(reloaded, ids)
        files = sorted(p.name for p in dst.iterdir())
    diff = float(np.abs(got - reference).max())
    return {"files": files, "max_abs_logit_diff": diff}, got.astype(np.float32)


def wheel_sha(package: str) -> str | None:
    try:
        from importlib.metadata import distribution

        record = distribution(package).read_text("RECORD") or ""
        return hashlib.sha256(record.encode()).hexdigest()
    except Exception:
        return None


def record(case: str, seed: int, rng: np.random.Generator) -> tuple[dict, np.ndarray]:
    """Build, save and score one case; its sidecar entry and the Dew-save logits."""
    model = build(case, seed)
    shard = CASES[case][3]
    target = OUT / case
    model.save_pretrained(target, max_shard_size=shard) if shard else model.save_pretrained(target)
    vocab = model.config.vocab_size
    ids = rng.integers(0, vocab, size=(2, 12)).astype(np.int64)
    logits = logits_of(model, ids)
    free = greedy(model, None)
    extra = {}
    if getattr(model.config, "sliding_window", None) is not None:
        recomputed = greedy_without_cache(model)
        if recomputed != free:
            sys.exit(f"{case}: cached generate {free} != uncached greedy {recomputed}")
        # The longest prompt with its continuation, scored whole: what each cached
        # decoding step must reproduce once the window has slid past the prompt's start.
        longest = max(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i]))
        decode_ids = np.array([list(PROMPTS[longest]) + free[longest]], np.int64)
        extra = {
            "decode_ids": decode_ids.astype(np.int32),
            "decode_logits": logits_of(model, decode_ids).astype(np.float32),
        }
    eos = int(free[0][4])
    stopped = greedy(model, eos)
    free_arr, free_len = pad(free)
    stop_arr, stop_len = pad(stopped)
    save_arrays(
        OUT / f"{case}.npz",
        ids=ids.astype(np.int32),
        logits=logits.astype(np.float32),
        greedy=free_arr,
        greedy_lengths=free_len,
        greedy_eos=stop_arr,
        greedy_eos_lengths=stop_len,
        eos_id=np.int32(eos),
        **extra,
    )
    check, reloaded = dew_roundtrip(case, ids, logits)
    entry = {
        "architecture": type(model).__name__,
        "files": sorted(p.name for p in target.iterdir()),
        "eos_id": eos,
        "dew_save_reloaded_in_transformers": check,
    }
    print(case, "dew save -> transformers max |diff| =", check["max_abs_logit_diff"])
    return entry, reloaded


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sidecar: dict = {
        "package": "transformers",
        "version": transformers.__version__,
        "torch": torch.__version__,
        "record_sha256_transformers": wheel_sha("transformers"),
        "function": "XForCausalLM.forward logits; generate(do_sample=False)",
        "options": {"prompts": [list(p) for p in PROMPTS], "max_new_tokens": NEW_TOKENS},
        "cases": {},
    }
    reloaded = {}
    # Cases keep their order (seed = index, one shared id stream), so adding one at the
    # end leaves the earlier cases' checkpoints and arrays as they were.
    for seed, case in enumerate(CASES):
        sidecar["cases"][case], reloaded[case] = record(case, seed, rng)
    save_arrays(OUT / "dew_saves.npz", **reloaded)
    with open(OUT / ".models.json.tmp", "w") as handle:
        json.dump(sidecar, handle, indent=2, sort_keys=True)
    os.replace(OUT / ".models.json.tmp", OUT / "models.json")
    diffs = [
        c["dew_save_reloaded_in_transformers"]["max_abs_logit_diff"]
        for c in sidecar["cases"].values()
    ]
    if any(d != 0.0 for d in diffs):
        sys.exit("a Dew-saved checkpoint did not reproduce transformers' logits")


if __name__ == "__main__":
    main()

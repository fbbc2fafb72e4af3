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

Then it checks, once, that what Dew's `Pretrained.save` writes reloads in
transformers with the same logits: the workspace interpreter loads each
checkpoint with `dew.models.load_pretrained` and saves it (float32, one case
sharded), transformers reads it back, and the largest logit difference goes
into the JSON sidecar tests/fixtures/models/models.json.
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


def dew_roundtrip(case: str, ids: np.ndarray, reference: np.ndarray) -> dict:
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
    return {"files": files, "max_abs_logit_diff": diff, "ok": diff == 0.0}


def wheel_sha(package: str) -> str | None:
    try:
        from importlib.metadata import distribution

        record = distribution(package).read_text("RECORD") or ""
        return hashlib.sha256(record.encode()).hexdigest()
    except Exception:
        return None


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
    for seed, case in enumerate(CASES):
        model = build(case, seed)
        shard = CASES[case][3]
        target = OUT / case
        model.save_pretrained(target, max_shard_size=shard) if shard else model.save_pretrained(
            target
        )
        vocab = model.config.vocab_size
        ids = rng.integers(0, vocab, size=(2, 12)).astype(np.int64)
        logits = logits_of(model, ids)
        free = greedy(model, None)
        eos = int(free[0][4])
        stopped = greedy(model, eos)
        free_arr, free_len = pad(free)
        stop_arr, stop_len = pad(stopped)
        np.savez_compressed(
            OUT / f"{case}.npz",
            ids=ids.astype(np.int32),
            logits=logits.astype(np.float32),
            greedy=free_arr,
            greedy_lengths=free_len,
            greedy_eos=stop_arr,
            greedy_eos_lengths=stop_len,
            eos_id=np.int32(eos),
        )
        check = dew_roundtrip(case, ids, logits)
        sidecar["cases"][case] = {
            "architecture": type(model).__name__,
            "files": sorted(p.name for p in target.iterdir()),
            "eos_id": eos,
            "dew_save_reloaded_in_transformers": check,
        }
        print(case, "dew save -> transformers max |diff| =", check["max_abs_logit_diff"])
    with open(OUT / ".models.json.tmp", "w") as handle:
        json.dump(sidecar, handle, indent=2, sort_keys=True)
    os.replace(OUT / ".models.json.tmp", OUT / "models.json")
    if not all(c["dew_save_reloaded_in_transformers"]["ok"] for c in sidecar["cases"].values()):
        sys.exit("a Dew-saved checkpoint did not reproduce transformers' logits")


if __name__ == "__main__":
    main()

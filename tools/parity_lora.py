"""Record PEFT's LoRA on tiny Llama and Qwen3 checkpoints, for dew.models.lora's parity test.

Run with the reference interpreter (torch 2.13.0 CPU, transformers 5.x, peft 0.21.2):

    $(tools/reference_env.sh) tools/parity_lora.py

For each case it builds a small random base with transformers (norm scales
randomised so every tensor matters), wraps it with `peft.get_peft_model`,
overwrites every `lora_A`/`lora_B` with seeded random values (a fresh adapter
has B = 0 and would hide the adapter path), and writes under
tests/fixtures/lora/:

* <case>/base/: the base checkpoint (`save_pretrained`, float32);
* <case>/adapter/: the adapter as PEFT saves it (`adapter_model.safetensors`,
  `adapter_config.json`; PEFT's generated README.md is dropped);
* <case>.npz: ids [2, 10], PEFT's logits [2, 10, V] in eval mode, the base's
  logits with the adapter disabled, the loss (mean next-token cross-entropy of
  the ids, `loss`) and its gradient for every adapter factor, stored under
  the factor's PEFT key (torch orientation, float32).

Then it checks the other direction: the workspace interpreter loads the
PEFT-saved adapter with `dew.models.lora.load_peft_adapter`, writes it again
with `save_peft_adapter`, and saves the merged weights (`merge_adapters`) with
`Pretrained.save`. PEFT loads Dew's adapter onto a fresh base
(`PeftModel.from_pretrained`) and transformers loads the merged checkpoint;
both score the same ids. The JSON sidecar tests/fixtures/lora/lora.json holds,
per case, the largest logit differences of those two from PEFT's recorded
logits, whether Dew's tensors equal PEFT's saved ones bit for bit, and the
config fields PEFT read from Dew's adapter_config.json. The script runs itself
again under PYTHONHASHSEED=0, so the order PEFT writes `target_modules` in (a
set) and with it every fixture file is the same from run to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "lora"
WORKSPACE_PYTHON = ROOT / ".venv" / "bin" / "python"
BASE = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    max_position_embeddings=64,
)
CASES = {
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(BASE, rms_norm_eps=1e-5, tie_word_embeddings=False),
        dict(
            r=4,
            lora_alpha=8,
            lora_dropout=0.1,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],  # fmt: skip
        ),
    ),
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(BASE, head_dim=16, rope_theta=1e6, tie_word_embeddings=True),
        dict(
            r=3,
            lora_alpha=6,
            use_rslora=True,
            target_modules=r".*\.(q_proj|v_proj|down_proj)",
        ),
    ),
}
READ_FIELDS = ("r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules", "peft_type")


def build_base(case: str, seed: int) -> torch.nn.Module:
    config_cls, model_cls, kwargs, _ = CASES[case]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif param.dim() == 2:
                param.normal_(0.0, 0.08)
    return model


def randomise_adapter(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)


def loss_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `ids` [B, T] under `logits` [B, T, V]."""
    vocab = logits.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)
    )


def logits_of(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    """`np.savez_compressed`, unless `path` already holds exactly these arrays."""
    if path.exists():
        with np.load(path) as old:
            same = set(old.files) == set(arrays) and all(
                old[k].dtype == v.dtype and np.array_equal(old[k], v) for k, v in arrays.items()
            )
        if same:
            return
    np.savez_compressed(path, **arrays)


def gradients(model: torch.nn.Module, ids: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and its gradient per adapter factor, keyed as PEFT saves the factor."""
    model.zero_grad()
    loss = loss_of(model(torch.tensor(ids)).logits, torch.tensor(ids))
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert "lora_" in name, f"{name} is trainable"
            key = name.replace(".default.weight", ".weight")
            grads[f"grad:{key}"] = param.grad.float().numpy().copy()
    return float(loss), grads


DEW_EXPORT = """
import sys
from dew.models import load_pretrained
from dew.models.lora import load_peft_adapter, merge_adapters, save_peft_adapter
base, adapter, out = sys.argv[1], sys.argv[2], sys.argv[3]
p = load_pretrained(base)
adapters, lora = load_peft_adapter(adapter, p.config)
save_peft_adapter(out + "/adapter", adapters, p.config, lora)
merged = merge_adapters(p.variables["params"], adapters, p.config, lora)
p.replace(variables={"params": merged}).save(out + "/merged", dtype="float32")
"""


def dew_roundtrip(case: str, ids: np.ndarray, reference: np.ndarray) -> dict:
    """Export the case's adapter (and merged weights) with Dew; read both back in torch."""
    folder = OUT / case
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(WORKSPACE_PYTHON), "-c", DEW_EXPORT, str(folder / "base"),
             str(folder / "adapter"), tmp],
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )  # fmt: skip
        base = AutoModelForCausalLM.from_pretrained(folder / "base", dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, Path(tmp) / "adapter").eval()
        adapter_logits = logits_of(adapted, ids)
        merged = AutoModelForCausalLM.from_pretrained(Path(tmp) / "merged", dtype=torch.float32)
        merged_logits = logits_of(merged.eval(), ids)
        read = PeftConfig.from_pretrained(Path(tmp) / "adapter")
        fields = {f: _plain(getattr(read, f)) for f in READ_FIELDS}
        ours = load_file(Path(tmp) / "adapter" / "adapter_model.safetensors")
        theirs = load_file(folder / "adapter" / "adapter_model.safetensors")
        files = sorted(p.name for p in (Path(tmp) / "adapter").iterdir())
    same = sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    return {
        "adapter_files": files,
        "adapter_tensors_equal_peft_saved": same,
        "peft_read_config": fields,
        "dew_adapter_in_peft_max_abs_logit_diff": float(np.abs(adapter_logits - reference).max()),
        "dew_merged_in_transformers_max_abs_logit_diff": float(
            np.abs(merged_logits - reference).max()
        ),
    }


def _plain(value: object) -> object:
    if isinstance(value, set):
        return sorted(value)
    return getattr(value, "value", value)


def record(case: str, seed: int, rng: np.random.Generator) -> dict:
    """Build, adapt, score, differentiate and save one case; its sidecar entry."""
    base = build_base(case, seed)
    folder = OUT / case
    base.save_pretrained(folder / "base")
    ids = rng.integers(0, base.config.vocab_size, size=(2, 10)).astype(np.int64)
    base_logits = logits_of(base, ids)
    model = get_peft_model(base, LoraConfig(**CASES[case][3]))
    randomise_adapter(model, seed)
    model.eval()
    logits = logits_of(model, ids)
    loss, grads = gradients(model, ids)
    model.save_pretrained(folder / "adapter")
    (folder / "adapter" / "README.md").unlink(missing_ok=True)
    save_arrays(
        OUT / f"{case}.npz",
        ids=ids.astype(np.int32),
        logits=logits.astype(np.float32),
        base_logits=base_logits.astype(np.float32),
        loss=np.float32(loss),
        **grads,
    )
    entry = {
        "architecture": type(base).__name__,
        "lora_config": {k: _plain(v) for k, v in CASES[case][3].items()},
        "loss": loss,
        **dew_roundtrip(case, ids, logits),
    }
    print(case, json.dumps(entry, indent=1))
    return entry


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # PEFT keeps target_modules as a set and saves it in iteration order: a fixed hash
        # seed makes adapter_config.json the same on every run
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"}
        )
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sidecar: dict = {
        "package": "peft",
        "version": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "function": "get_peft_model(...).forward logits (eval) and autograd of the "
        "mean next-token cross-entropy w.r.t. lora_A/lora_B; save_pretrained",
        "cases": {case: record(case, seed, rng) for seed, case in enumerate(CASES)},
    }
    with open(OUT / ".lora.json.tmp", "w") as handle:
        json.dump(sidecar, handle, indent=2, sort_keys=True)
    os.replace(OUT / ".lora.json.tmp", OUT / "lora.json")
    for case, entry in sidecar["cases"].items():
        worst = max(
            entry["dew_adapter_in_peft_max_abs_logit_diff"],
            entry["dew_merged_in_transformers_max_abs_logit_diff"],
        )
        if not entry["adapter_tensors_equal_peft_saved"] or worst > 1e-4:
            sys.exit(f"{case}: Dew's exported adapter or merged weights disagree with PEFT")


if __name__ == "__main__":
    main()

"""Benchmark Dew's SFT step against TRL's SFTTrainer and a plain torch loop, same model and batch.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_sft.py [--steps 8] [--quick]

The reference interpreter (tools/reference_env.sh: torch CPU, transformers, TRL 1.16.0)
writes a random 5.2M-parameter Qwen3 checkpoint (4 layers, width 256, 4 heads, 2 KV heads,
head_dim 64, MLP 1088, vocab 4096, tied, float32) and times, on [8, 256] tokens per step with
AdamW: TRL's SFTTrainer (its own training loop over a tokenised dataset), a plain torch loop,
and torch's float32 matmul peak. Then Dew loads the same checkpoint with
``dew.models.load_pretrained`` and times its compiled Trainer step (LMObjective + AdamW) in
several variants, the ``jnp.dot`` peak and the first step's compile time.

Printed: tokens/s of each, the ratios Dew / TRL and Dew / torch loop (above 1: Dew faster),
and each one's share of its own framework's matmul peak (model FLOPs = 6 x parameters x
tokens + attention). Both frameworks share the machine's cores; run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
B, T = 8, 256
CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=1088, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip

REFERENCE = r"""
import json, sys, time, tempfile
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, TrainerCallback
directory, steps, B, T, cfg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
torch.manual_seed(0)
config = Qwen3Config(**cfg, max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0)
model = Qwen3ForCausalLM(config).float()
model.save_pretrained(directory)
params = sum(p.numel() for p in model.parameters())
out = {"params": params, "torch": torch.__version__, "threads": torch.get_num_threads()}
def peak():
    best = 0.0
    for n in (512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        t = time.perf_counter(); reps = 10
        for _ in range(reps): a @ b
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t))
    return best
out["matmul_peak"] = peak()
gen = torch.Generator().manual_seed(1)
rows = torch.randint(1, cfg["vocab_size"], (B * (steps + 3), T), generator=gen)
# plain torch loop
m = Qwen3ForCausalLM(config).float(); m.load_state_dict(model.state_dict()); m.train()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
times = []
for i in range(steps + 2):
    ids = rows[i * B:(i + 1) * B]
    t = time.perf_counter()
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
out["torch_step_s"] = sorted(times[2:])[len(times[2:]) // 2]
# TRL SFTTrainer
from datasets import Dataset
from trl import SFTConfig, SFTTrainer
from transformers import PreTrainedTokenizerFast
import trl
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[6])  # only pads; rows are pre-tokenised
out["trl"] = trl.__version__
stamps = []
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        stamps.append(time.perf_counter())
ds = Dataset.from_dict({"input_ids": rows.tolist()})
m2 = Qwen3ForCausalLM(config).float(); m2.load_state_dict(model.state_dict())
with tempfile.TemporaryDirectory() as tmp:
    args = SFTConfig(output_dir=tmp, per_device_train_batch_size=B, max_steps=steps + 2, max_length=T,
                     packing=False, learning_rate=1e-4, optim="adamw_torch", report_to="none",
                     logging_strategy="no", save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                     lr_scheduler_type="constant", warmup_steps=0)
    trainer = SFTTrainer(model=m2, args=args, train_dataset=ds, processing_class=tokenizer,
                         callbacks=[Clock()])
    trainer.train()
gaps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
out["trl_step_s"] = sorted(gaps)[len(gaps) // 2]
print(json.dumps(out))
"""


def reference_python() -> str:
    script = ROOT / "tools" / "reference_env.sh"
    done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def model_flops(params: int, layers: int, heads: int, head_dim: int) -> float:
    """Training FLOPs of one step: 6 x params x tokens + causal attention (fwd + bwd)."""
    tokens = B * T
    attention = 6 * layers * heads * head_dim * T * tokens  # QK^T and AV, causal half, x3 for bwd
    return 6.0 * params * tokens + attention


def run_dew(directory: str, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dew import models
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    out: dict = {"jax": jax.__version__, "devices": jax.device_count()}

    def peak() -> float:
        best = 0.0
        for n in (512, 1024):
            a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
            f = jax.jit(lambda x, y: x @ y)
            f(a, a).block_until_ready()
            reps = 10
            t = time.perf_counter()
            for _ in range(reps):
                r = f(a, a)
            r.block_until_ready()
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - t))
        return best

    out["matmul_peak"] = peak()
    pre = models.load_pretrained(directory)
    rng = np.random.default_rng(1)
    batches = [
        {"text": rng.integers(1, CONFIG["vocab_size"], (B, T + 1)).astype(np.int32)}
        for _ in range(steps + 2)
    ]

    class NaiveLM(LMObjective):
        """The first version: a full [B, T, V] log_softmax array, then the targets picked."""

        @staticmethod
        def token_nll(logits, targets):
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
            return nll, jnp.argmax(logits, axis=-1) == targets

    bf16 = models.build("qwen3", **{**pre.config.__dict__, "dtype": "bfloat16"})
    variants = {
        "dew": (LMObjective, pre.model),
        "dew_naive_log_softmax": (NaiveLM, pre.model),
        "dew_bf16_compute": (LMObjective, bf16),
    }
    from dew.trainer.mesh import global_batch

    runs = {}
    for name, (cls, model) in variants.items():  # compile and run the first step of each
        objective = cls(model, T, pretrained=dict(pre.variables), ema_decay=None)
        trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                          devices=jax.devices()[:1])  # fmt: skip
        state = trainer.initial_state()
        placed = [global_batch(b, trainer.mesh) for b in batches]
        step = trainer._step()
        t = time.perf_counter()
        state, metrics = step(state, placed[0])
        jax.block_until_ready(metrics)
        runs[name] = [step, state, placed, time.perf_counter() - t, []]
    for i in range(1, steps + 2):  # timed steps, round robin so load drifts hit all alike
        for run in runs.values():
            step, state, placed = run[0], run[1], run[2]
            t = time.perf_counter()
            state, metrics = step(state, placed[i])
            jax.block_until_ready(metrics)
            run[4].append(time.perf_counter() - t)
            run[1] = state
    for name, run in runs.items():
        times = run[4][1:]
        out[name] = {"first_step_s": run[3], "step_s": sorted(times)[len(times) // 2]}
    out["matmul_peak"] = max(out["matmul_peak"], peak())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per contender")
    parser.add_argument("--quick", action="store_true", help="3 timed steps")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run(
            [reference_python(), "-c", REFERENCE, directory, str(steps), str(B), str(T),
             json.dumps(CONFIG), str(ROOT / "tests" / "fixtures" / "chat" / "tokenizer")],
            capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(done.stderr[-4000:])
        ref = json.loads(done.stdout.strip().splitlines()[-1])
        dew = run_dew(directory, steps)
    flops = model_flops(ref["params"], CONFIG["num_hidden_layers"], CONFIG["num_attention_heads"],
                        CONFIG["head_dim"])  # fmt: skip
    tokens = B * T
    print(f"model: Qwen3 {ref['params'] / 1e6:.2f}M parameters, [{B}, {T}] tokens per step, AdamW")
    print(f"torch {ref['torch']} ({ref['threads']} threads), TRL {ref['trl']}, JAX {dew['jax']}")
    print(f"matmul peak: torch {ref['matmul_peak'] / 1e9:.1f} GFLOP/s, "
          f"jnp.dot {dew['matmul_peak'] / 1e9:.1f} GFLOP/s")  # fmt: skip
    rows = [("TRL SFTTrainer", ref["trl_step_s"], ref["matmul_peak"]),
            ("torch loop", ref["torch_step_s"], ref["matmul_peak"])]  # fmt: skip
    for name in ("dew", "dew_naive_log_softmax", "dew_bf16_compute"):
        rows.append((name, dew[name]["step_s"], dew["matmul_peak"]))
    for name, step_s, peak in rows:
        print(f"{name:24s} {tokens / step_s:9.0f} tokens/s  step {step_s * 1e3:7.1f} ms  "
              f"{flops / step_s / peak:5.2f} of its matmul peak")  # fmt: skip
    d = dew["dew"]["step_s"]
    print(f"ratio dew / TRL SFTTrainer: {ref['trl_step_s'] / d:.2f}x   (goal >= 1.5)")
    print(f"ratio dew / torch loop:     {ref['torch_step_s'] / d:.2f}x")
    print(f"dew share of jnp.dot peak:  {flops / d / dew['matmul_peak']:.2f}   (goal >= 0.45)")
    print(f"what each change bought: full log_softmax -> logsumexp NLL: "
          f"{dew['dew_naive_log_softmax']['step_s'] / d:.2f}x; bf16 compute: "
          f"{d / dew['dew_bf16_compute']['step_s']:.2f}x")  # fmt: skip
    print(f"first step (compile + run): {dew['dew']['first_step_s']:.2f} s   (goal < 5 s)")


if __name__ == "__main__":
    main()

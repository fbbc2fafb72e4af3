"""Benchmark Dew's SFT step against TRL's SFTTrainer and a plain torch loop, same model and batch.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_sft.py [--rounds 5] [--steps 4] [--cpus 0,1] [--threads 2]

A reference worker (tools/reference_env.sh: torch CPU, transformers, TRL 1.16.0) writes a
random Qwen3 checkpoint (``--shape small``: 5.2M parameters, 4 layers, width 256, 4 heads,
2 KV heads, head_dim 64, MLP 1088, vocab 4096, tied; ``--shape qwen3-0.6b``: the 0.6B shape,
for a machine that can hold it) and stays up, serving: a plain torch loop (forward, backward,
AdamW), TRL's SFTTrainer (its own loop, run in a thread that a callback pauses between
rounds) and torch's float32 matmul peak. Dew loads the same checkpoint with
``dew.models.load_pretrained`` and times its compiled Trainer step (LMObjective + AdamW, the
library's own path), the same step with bfloat16 compute, and the ``jnp.dot`` peak.

All of these are contenders in the same interleaved rounds (tools/bench/_rounds.py), pinned
to the same CPUs with the same thread count. A round's value is the median of ``--steps``
steps. Printed: median and spread per contender; ratios of medians (TRL / Dew and torch loop /
Dew step time: above 1, Dew faster) with the per-round spread and a verdict; Dew's share of
the same-round ``jnp.dot`` peak (model FLOPs = 6 x parameters x tokens + attention); the first
step's time (compile + run); the ceilings (TRL's and the torch loop's step time over the time
the step's FLOPs take at the same-round ``jnp.dot`` peak: the ratio a Dew step at the peak
would reach). Record: tools/bench/results/sft.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import (  # noqa: E402
    WORKER_LOOP,
    Bench,
    Worker,
    add_arguments,
    jnp_dot_peak,
    mfu_text,
    reference_python,
    revision_env,
    revision_name,
    spread,
)
from _shapes import SHAPES, add_model_arguments  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOAL_TRL, GOAL_TORCH, GOAL_PEAK, GOAL_FIRST = 1.5, 1.2, 0.45, 5.0

REFERENCE = (
    WORKER_LOOP
    + r"""
import statistics, tempfile, threading, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, TrainerCallback
threads = torch_threads(torch)
directory, B, T, cfg, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
tok_dir, device = sys.argv[6], sys.argv[7]
torch.manual_seed(0)
config = Qwen3Config(**cfg, max_position_embeddings=max(1024, T), tie_word_embeddings=True, rope_theta=10000.0)
model = Qwen3ForCausalLM(config).float()
model.save_pretrained(directory)
params = sum(p.numel() for p in model.parameters())
torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
gen = torch.Generator().manual_seed(1)
rows = torch.randint(1, cfg["vocab_size"], (B * 16, T), generator=gen)

m = Qwen3ForCausalLM(config).to(torch_dtype); m.load_state_dict(model.state_dict()); m.to(device).train()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
cursor = [0]
def torch_steps(steps):
    times = []
    for _ in range(steps):
        i = cursor[0] % 16; cursor[0] += 1
        ids = rows[i * B:(i + 1) * B].to(device)
        sync(torch, device)
        t = time.perf_counter()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        sync(torch, device)
        times.append(time.perf_counter() - t)
    return {"step_s": times}

# TRL's SFTTrainer runs in a thread; a callback pauses it after the steps a round asked for.
try:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    import trl
except ImportError as error:  # a machine without TRL (an accelerator's image) still runs the rest
    trl = None
    print(f"TRL not importable, its contender is skipped: {error}", file=sys.stderr, flush=True)
if trl is not None:
    from transformers import PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)  # only pads; rows are pre-tokenised
    budget, go, done, stamps = [0], threading.Event(), threading.Event(), []
    class Gate(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            sync(torch, device)  # on an accelerator: the step's kernels have finished
            stamps.append(time.perf_counter())
            budget[0] -= 1
            if budget[0] <= 0:
                done.set(); go.wait(); go.clear()
                stamps.append(time.perf_counter())
    m2 = Qwen3ForCausalLM(config).to(torch_dtype); m2.load_state_dict(model.state_dict()); m2.to(device)
    tmp = tempfile.mkdtemp()
    ds = Dataset.from_dict({"input_ids": rows.tolist()})
    sft_args = SFTConfig(output_dir=tmp, per_device_train_batch_size=B, max_steps=1_000_000, max_length=T,
                         packing=False, learning_rate=1e-4, optim="adamw_torch", report_to="none",
                         logging_strategy="no", save_strategy="no", use_cpu=device == "cpu", dataloader_num_workers=0,
                         lr_scheduler_type="constant", warmup_steps=0, bf16=dtype == "bfloat16",
                         disable_tqdm=True)
    trainer = SFTTrainer(model=m2, args=sft_args, train_dataset=ds, processing_class=tokenizer, callbacks=[Gate()])
    budget[0] = 2
    threading.Thread(target=trainer.train, daemon=True).start()
    done.wait(); done.clear()  # two warm-up steps
    def trl_steps(steps):
        stamps.clear(); budget[0] = steps; go.set(); done.wait(); done.clear()
        return {"step_s": [b - a for a, b in zip(stamps[:-1], stamps[1:])]}
torch_steps(2)
import transformers
handlers = {"torch": torch_steps, "peak": lambda reps: torch_matmul_peak(torch, reps, device)}
if trl is not None:
    handlers["trl"] = trl_steps
serve(handlers,
      {"params": params, "torch": torch.__version__, "threads": threads,
       "trl": trl.__version__ if trl is not None else None,
       "transformers": transformers.__version__,
       "device": torch.cuda.get_device_name() if device != "cpu" else "cpu"})
"""
)


def model_flops(params: int, cfg: dict, b: int, t: int) -> float:
    """Training FLOPs of one step: 6 x params x tokens + causal attention (fwd + bwd)."""
    tokens = b * t
    heads, head_dim = cfg["num_attention_heads"], cfg["head_dim"]
    attention = 6 * cfg["num_hidden_layers"] * heads * head_dim * t * tokens
    return 6.0 * params * tokens + attention


def dew_flags(args: argparse.Namespace) -> list[str]:
    """The flags a ``--serve-dew`` worker needs to build the same Dew contender."""
    return ["--shape", args.shape, "--dtype", args.dtype, "--batch", str(args.batch),
            "--seq", str(args.seq), "--steps", str(args.steps)]  # fmt: skip


def dew_side(directory: str, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Dew's contenders on the checkpoint in ``directory``: compiled Trainer steps.

    Returns ``(runs, dew_steps)``: ``runs[name]`` holds the step, state, placed batches and
    the first step's time; ``dew_steps(name)`` is a round's callable (``--steps`` times).
    Uses whichever ``dew`` this interpreter imports (``--base`` workers import a revision).
    """
    import jax
    import numpy as np
    import optax

    from dew import models

    try:
        from dew.mesh import global_batch
    except ImportError:  # a --base revision from before the mesh helpers became dew.mesh
        from dew.trainer.mesh import global_batch  # type: ignore[no-redef]
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    cfg, b, t = SHAPES[args.shape], args.batch, args.seq
    pre = models.load_pretrained(directory)
    rng = np.random.default_rng(1)
    batches = [
        {"text": rng.integers(1, cfg["vocab_size"], (b, t + 1)).astype(np.int32)} for _ in range(8)
    ]
    variants = {"dew": pre.model}
    if args.dtype == "float32" and not args.serve_dew:
        variants["dew_bf16_compute"] = models.build(
            "qwen3", **{**pre.config.__dict__, "dtype": "bfloat16"}
        )
    elif args.dtype == "bfloat16":
        variants = {"dew": models.build("qwen3", **{**pre.config.__dict__, "dtype": "bfloat16"})}
    runs: dict[str, dict] = {}
    for name, model in variants.items():
        objective = LMObjective(model, t, pretrained=dict(pre.variables), ema_decay=None)
        trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                          devices=jax.devices()[:1])  # fmt: skip
        state = trainer.initial_state()
        placed = [global_batch(x, trainer.mesh) for x in batches]
        step = trainer._step()
        start = time.perf_counter()
        state, metrics = step(state, placed[0])
        jax.block_until_ready(metrics)
        runs[name] = {"step": step, "state": state, "placed": placed, "i": 1,
                      "first_step_s": time.perf_counter() - start}  # fmt: skip

    def dew_steps(name: str):  # type: ignore[no-untyped-def]
        run = runs[name]

        def call() -> list[float]:
            times = []
            for _ in range(args.steps):
                batch = run["placed"][run["i"] % len(run["placed"])]
                run["i"] += 1
                start = time.perf_counter()
                run["state"], metrics = run["step"](run["state"], batch)
                jax.block_until_ready(metrics)
                times.append(time.perf_counter() - start)
            return times

        return call

    return runs, dew_steps


def serve_dew(args: argparse.Namespace) -> None:
    """Worker mode for ``--base``: Dew's step on ``--serve-dew DIR``, over JSON lines."""
    import dew.models

    runs, dew_steps = dew_side(args.serve_dew, args)
    loop: dict = {}
    exec(WORKER_LOOP, loop)  # the reference workers' JSON-lines loop
    calls = {name: dew_steps(name) for name in runs}
    loop["serve"](
        {"steps": lambda name: {"step_s": calls[name]()}},
        {"dew_models": dew.models.__file__,
         "first_step_s": {k: r["first_step_s"] for k, r in runs.items()}},
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per contender a round")
    add_model_arguments(parser)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--base", default="",
                        help="also time Dew as of this git revision (e.g. main) in a worker, "
                        "same rounds; prints base / this tree")  # fmt: skip
    parser.add_argument("--serve-dew", default="", help=argparse.SUPPRESS)  # internal: worker
    args = parser.parse_args()
    if args.serve_dew:
        serve_dew(args)
        return
    bench = Bench("sft", args.cpus, args.threads, args.device)  # before jax: pins, thread flags

    import jax

    cfg, b, t = SHAPES[args.shape], args.batch, args.seq
    tok = str(ROOT / "tests" / "fixtures" / "chat" / "tokenizer")
    with tempfile.TemporaryDirectory() as directory:
        worker = Worker([reference_python(), "-c", REFERENCE, directory, str(b), str(t),
                         json.dumps(cfg), args.dtype, tok, args.device])  # fmt: skip
        base = None
        try:
            info = worker.info
            runs, dew_steps = dew_side(directory, args)
            if args.base:
                base_label = f"dew {revision_name(args.base)}"
                env = revision_env(args.base, Path(directory) / "base")
                base = Worker([sys.executable, str(Path(__file__).resolve()), "--serve-dew",
                               directory, *dew_flags(args)], env=env)  # fmt: skip
                info["base"] = base.info
            flops = model_flops(info["params"], cfg, b, t)

            def torch_peak() -> float:
                return flops / worker.ask(op="peak", reps=10)["flops_per_s"]

            contenders = {
                **(
                    {"trl": lambda: worker.ask(op="trl", steps=args.steps)["step_s"]}
                    if info["trl"]
                    else {}
                ),  # fmt: skip
                "torch": lambda: worker.ask(op="torch", steps=args.steps)["step_s"],
                **{name: dew_steps(name) for name in runs},
                **(
                    {}
                    if base is None
                    else {base_label: lambda: base.ask(op="steps", name="dew")["step_s"]}
                ),  # fmt: skip
                "jnp.dot peak": jnp_dot_peak(flops, device=args.device),
                "torch matmul peak": torch_peak,
            }
            for fn in contenders.values():  # one untimed pass: warm caches and allocators
                fn()
            times = bench.rounds(contenders, args.rounds)
        finally:
            worker.close()
            if base is not None:
                base.close()
    tokens = b * t
    bench.say(
        f"model: Qwen3 '{args.shape}' {info['params'] / 1e6:.2f}M parameters, [{b}, {t}] tokens "
        f"per step, AdamW, {args.dtype} compute; torch {info['torch']} ({info['threads']} "
        f"threads), TRL {info['trl']}, transformers {info['transformers']}, JAX {jax.__version__} "
        f"on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), torch on "
        f"{info.get('device', 'cpu')}; {args.rounds} rounds x {args.steps} steps, interleaved"
    )
    if args.base:
        bench.say(f"  {base_label}: dew imported from {info['base']['dew_models']} (a worker)")
    bench.say("step time per contender (peaks: the time the step's FLOPs take at that peak):")
    for name, values in times.items():
        median = spread(values).median
        mfu = mfu_text(flops, median, args.peak_tflops)
        bench.show(name, values, extra=f"{tokens / median:9.0f} tokens/s{mfu}")
    if "trl" in times:
        bench.compare("TRL SFTTrainer / dew (step time)", times["trl"], times["dew"], GOAL_TRL)
    bench.compare("torch loop / dew (step time)", times["torch"], times["dew"], GOAL_TORCH)
    bench.compare("dew share of same-round jnp.dot peak", times["jnp.dot peak"], times["dew"],
                  GOAL_PEAK)  # fmt: skip
    bench.compare("torch loop share of torch matmul peak", times["torch matmul peak"],
                  times["torch"])  # fmt: skip
    # The highest ratios a Dew step running at the jnp.dot peak reaches: a ceiling below a
    # goal means no Dew step on this machine meets that goal.
    if "trl" in times:
        bench.compare("ceiling: TRL SFTTrainer / jnp.dot peak time", times["trl"],
                      times["jnp.dot peak"], GOAL_TRL)  # fmt: skip
    bench.compare("ceiling: torch loop / jnp.dot peak time", times["torch"],
                  times["jnp.dot peak"], GOAL_TORCH)  # fmt: skip
    if args.base:
        bench.compare(f"{base_label} / dew (step time: this tree's speed-up)", times[base_label],
                      times["dew"])  # fmt: skip
    if "dew_bf16_compute" in times:
        bench.compare("bf16 compute gain (dew / dew_bf16)", times["dew"], times["dew_bf16_compute"])
    first = runs["dew"]["first_step_s"]
    bench.say(f"  first step (compile + run): {first:.2f} s  goal < {GOAL_FIRST:g} s: "
              f"{'met' if first < GOAL_FIRST else 'not met'}")  # fmt: skip
    bench.finish({"args": vars(args), "reference": info, "params": info["params"],
                  "model_flops": flops, "first_step_s": {k: r["first_step_s"] for k, r in runs.items()}})  # fmt: skip


if __name__ == "__main__":
    main()

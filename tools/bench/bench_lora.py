"""Benchmark LoRA SFT: Dew's LoraObjective against TRL's SFTTrainer with PEFT, and both full.

Run from the repository root with the workspace interpreter (the documented, pinned run):

    .venv/bin/python tools/bench/bench_lora.py --rounds 3 --cpus 1 --threads 1
    .venv/bin/python tools/bench/bench_lora.py --shapes small --rounds 3 --cpus 1 --threads 1

Per shape (``small``: tools/bench/_shapes.py's 5.2M-parameter Qwen3; ``qwen3-100m``: width
768, 12 layers, 12 heads, 4 KV heads, head_dim 64, MLP 2048, vocab 32000, tied: 100.3M
parameters), a reference worker (tools/bench/trl_lora_step.py) writes one random Qwen3
checkpoint that every contender loads, and ``--batch x --seq`` random tokens (default 2 x 128)
make each step's batch. The LoRA adapter is rank 16, alpha 32, on q, k, v, o, gate, up and
down in both libraries (Dew's ``LoraConfig``, peft's ``LoraConfig``), no dropout; the
optimizer is AdamW (lr 1e-4) on whatever trains. Three measurements:

1. step time, five contenders in the same interleaved rounds (tools/bench/_rounds.py, pinned
   to the same CPUs and thread count): Dew's compiled Trainer step with ``LMObjective``
   (``dew full``) and with ``LoraObjective(LMObjective)`` (``dew lora``), TRL's SFTTrainer
   full (``trl full``) and with ``peft_config`` (``trl peft``), each in its own worker, and
   the time the full step's FLOPs take at the same-round ``jnp.dot`` peak. A round's value
   is the median of ``--steps`` steps. Ratios (above 1: Dew faster), goal 1.0: TRL+PEFT /
   Dew LoRA and TRL full / Dew full, with the per-round spread and a verdict;
2. peak resident memory: after the rounds, one fresh process per configuration loads the
   checkpoint, builds its trainer, trains ``--probe-steps`` steps and reports Linux
   ``VmHWM`` (and ``VmRSS`` after its imports, before any model exists: jax and dew on one
   side, torch and TRL on the other);
3. bytes: Adam's moments (``mu`` and ``nu`` of Dew's real TrainState after the timed steps;
   ``exp_avg`` and ``exp_avg_sq`` of torch's ``optimizer.state``), full against LoRA, and
   what a frozen reference costs (DPO, or GRPO with ``beta > 0``): Dew's ``TrainState.ema``
   of a ``DPOObjective`` with and without the adapter, by ``jax.eval_shape``.

Record: tools/bench/results/lora.json. Gradient checkpointing is off on both sides.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import (  # noqa: E402
    Bench,
    Worker,
    add_arguments,
    jnp_dot_peak,
    reference_python,
    spread,
)
from _shapes import SHAPES  # noqa: E402
from bench_sft import model_flops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "trl_lora_step.py"
TOKENIZER = ROOT / "tests" / "fixtures" / "chat" / "tokenizer"
LORA_SHAPES = {
    "small": SHAPES["small"],
    "qwen3-100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                       head_dim=64),
}  # fmt: skip
RANK, ALPHA, GOAL = 16, 32.0, 1.0
KINDS = ("dew full", "dew lora", "trl full", "trl peft")


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (``VmHWM``, ``VmRSS``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/self/status: expected a {field} line, found none")


def lora_config() -> Any:
    from dew.models.lora import PROJECTIONS, LoraConfig

    return LoraConfig(RANK, ALPHA, targets=PROJECTIONS)


def nbytes(tree: Any) -> int:
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def moment_bytes(opt_state: Any) -> int:
    """Bytes of Adam's first and second moments (every leaf under a ``mu`` or ``nu`` field)."""
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(opt_state)
    return sum(x.size * x.dtype.itemsize for path, x in leaves
               if any(getattr(k, "name", None) in ("mu", "nu") for k in path))  # fmt: skip


def build_dew(directory: str, kind: str, batch: int, seq: int) -> dict[str, Any]:
    """Dew's Trainer on the checkpoint in ``directory``: ``kind`` "dew full" or "dew lora".

    The Trainer takes the loaded weights over (``consume_pretrained``, as ``dew train``
    does), so the run holds one copy of them, not the loader's beside the state's.
    Returns the compiled step, the state after one (compiling) step, eight placed batches of
    ``[batch, seq + 1]`` random ids and the first step's seconds.
    """
    import jax
    import numpy as np
    import optax

    from dew import models
    from dew.mesh import global_batch
    from dew.objectives.lm import LMObjective
    from dew.objectives.lora import LoraObjective
    from dew.trainer import Trainer

    pre = models.load_pretrained(directory)
    objective: Any = LMObjective(pre.model, seq, pretrained=dict(pre.variables), ema_decay=None)
    if kind == "dew lora":
        objective = LoraObjective(objective, lora_config())
    trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                      devices=jax.devices()[:1], consume_pretrained=True)  # fmt: skip
    rng = np.random.default_rng(1)
    vocab = pre.model.config.vocab_size
    placed = [global_batch({"text": rng.integers(1, vocab, (batch, seq + 1)).astype(np.int32)},
                           trainer.mesh) for _ in range(8)]  # fmt: skip
    step = trainer._step()
    start = time.perf_counter()
    state, metrics = step(trainer.initial_state(), placed[0])
    jax.block_until_ready(metrics)
    return {"step": step, "state": state, "placed": placed, "i": 1, "model": pre.model,
            "first_step_s": time.perf_counter() - start}  # fmt: skip


def run_steps(run: dict[str, Any], steps: int) -> list[float]:
    """``steps`` timed steps of a ``build_dew`` run, cycling its batches; seconds each."""
    import jax

    times = []
    for _ in range(steps):
        batch = run["placed"][run["i"] % len(run["placed"])]
        run["i"] += 1
        start = time.perf_counter()
        run["state"], metrics = run["step"](run["state"], batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return times


def reference_bytes(model: Any, seq: int) -> dict[str, int]:
    """Bytes of the frozen reference a DPO TrainState keeps (``ema``), full and LoRA.

    Shapes only (``jax.eval_shape``); GRPO with ``beta > 0`` keeps the same copy.
    """
    import jax
    import optax

    from dew.objectives.lora import LoraObjective
    from dew.objectives.rl import DPOObjective
    from dew.trainer.step import make_init

    rng, full = jax.random.key(0), DPOObjective(model, seq_len=seq, beta=0.1)
    out = {}
    for label, objective in (("full", full), ("lora", LoraObjective(full, lora_config()))):
        variables = jax.eval_shape(objective.init, rng)
        state = jax.eval_shape(make_init(objective, optax.adamw(1e-4)), variables, rng)
        out[label] = nbytes(state.ema)
    return out


def probe_dew(args: argparse.Namespace) -> None:
    """Fresh-process mode: one Dew configuration's VmHWM after ``--probe-steps`` steps."""
    import jax  # noqa: F401
    import optax  # noqa: F401

    import dew.trainer  # noqa: F401

    rss_imports = status_bytes("VmRSS")
    run = build_dew(args.dir, args.probe, args.batch, args.seq)
    run_steps(run, args.probe_steps - 1)
    print(json.dumps({"vmhwm": status_bytes("VmHWM"), "rss_imports": rss_imports}), flush=True)


def probe(kind: str, directory: str, args: argparse.Namespace) -> dict[str, int]:
    """Run one configuration in a fresh process; its ``{"vmhwm", "rss_imports"}`` bytes."""
    flags = [str(args.batch), str(args.seq)]
    if kind.startswith("dew"):
        argv = [sys.executable, __file__, "--probe", kind, "--dir", directory,
                "--batch", flags[0], "--seq", flags[1], "--probe-steps", str(args.probe_steps)]  # fmt: skip
    else:
        argv = [reference_python(), str(WORKER), "probe", kind.split()[1], directory, *flags,
                str(TOKENIZER), str(args.probe_steps)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"probe {kind}: exited with {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_shape(bench: Bench, name: str, args: argparse.Namespace, directory: str) -> dict:
    """Write the checkpoint, run the interleaved rounds of one shape, measure the bytes."""
    cfg, b, t = LORA_SHAPES[name], args.batch, args.seq
    ref = reference_python()
    made = subprocess.run([ref, str(WORKER), "write", directory, json.dumps(cfg), str(t)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    params = json.loads(made.stdout.strip().splitlines()[-1])["params"]
    tok = str(TOKENIZER)
    workers = {kind: Worker([ref, str(WORKER), "serve", kind.split()[1], directory, str(b),
                             str(t), tok]) for kind in ("trl full", "trl peft")}  # fmt: skip
    try:
        runs = {kind: build_dew(directory, kind, b, t) for kind in ("dew full", "dew lora")}
        flops = model_flops(params, cfg, b, t)

        def trl(kind: str) -> Any:
            return lambda: workers[kind].ask(op="steps", steps=args.steps)["step_s"]

        def dew(kind: str) -> Any:
            return lambda: run_steps(runs[kind], args.steps)

        contenders = {**{k: dew(k) for k in runs}, **{k: trl(k) for k in workers},
                      "jnp.dot peak": jnp_dot_peak(flops)}  # fmt: skip
        for fn in contenders.values():  # one untimed pass: warm caches and allocators
            fn()
        times = bench.rounds(contenders, args.rounds, group=name)
        torch_opt = {k: w.ask(op="optimizer") for k, w in workers.items()}
        info = workers["trl peft"].info
    finally:
        for w in workers.values():
            w.close()
    dew_opt = {k: moment_bytes(r["state"].opt_state) for k, r in runs.items()}
    trainable = {k: nbytes(r["state"].params["params"]) // 4 for k, r in runs.items()}
    return {"params": params, "flops": flops, "times": times, "versions": info,
            "first_step_s": {k: r["first_step_s"] for k, r in runs.items()},
            "moment_bytes": {**dew_opt, **{k: v["moment_bytes"] for k, v in torch_opt.items()}},
            "torch_optimizer": torch_opt, "trainable": {**trainable, "trl peft":
                                                         torch_opt["trl peft"]["trainable"]},
            "reference_bytes": reference_bytes(runs["dew full"]["model"], t)}  # fmt: skip


def report_shape(bench: Bench, name: str, args: argparse.Namespace, out: dict) -> None:
    """Print one shape's step times, ratios, memory and bytes."""
    v, times = out["versions"], out["times"]
    full, lora = out["trainable"]["dew full"], out["trainable"]["dew lora"]
    bench.say(
        f"shape {name}: Qwen3 {out['params'] / 1e6:.1f}M parameters, [{args.batch}, {args.seq}] "
        f"tokens a step, AdamW, float32; LoRA rank {RANK} alpha {ALPHA:g} on q,k,v,o,gate,up,"
        f"down: {lora / 1e6:.3f}M trainable in Dew, {out['trainable']['trl peft'] / 1e6:.3f}M in "
        f"PEFT ({100 * lora / full:.2f}%); torch {v['torch']} ({v['threads']} threads), TRL "
        f"{v['trl']}, PEFT {v['peft']}, transformers {v['transformers']}; {args.rounds} rounds "
        f"x {args.steps} steps, interleaved"
    )
    tokens = args.batch * args.seq
    for label, values in times.items():
        bench.show(label, values, extra=f"{tokens / spread(values).median:8.0f} tokens/s")
    bench.compare(f"{name}: TRL+PEFT / dew lora (step time)", times["trl peft"],
                  times["dew lora"], GOAL)  # fmt: skip
    bench.compare(f"{name}: TRL full / dew full (step time)", times["trl full"],
                  times["dew full"], GOAL)  # fmt: skip
    bench.compare(f"{name}: dew full / dew lora (LoRA's speed-up)", times["dew full"],
                  times["dew lora"])  # fmt: skip
    bench.compare(f"{name}: TRL full / TRL+PEFT (LoRA's speed-up)", times["trl full"],
                  times["trl peft"])  # fmt: skip
    bench.compare(f"{name}: dew full share of jnp.dot peak", times["jnp.dot peak"],
                  times["dew full"])  # fmt: skip
    first = out["first_step_s"]
    bench.say(f"  first step (compile + run): dew full {first['dew full']:.2f} s, dew lora "
              f"{first['dew lora']:.2f} s")  # fmt: skip
    m, r = out["moment_bytes"], out["reference_bytes"]
    bench.say(f"  Adam moment bytes: dew full {m['dew full']:,}  dew lora {m['dew lora']:,}  "
              f"trl full {m['trl full']:,}  trl peft {m['trl peft']:,}")  # fmt: skip
    bench.say(f"  frozen reference bytes (DPO, GRPO beta > 0; Dew TrainState.ema): full "
              f"{r['full']:,}  lora {r['lora']:,}")  # fmt: skip


def memory_table(bench: Bench, memory: dict[str, dict[str, dict[str, int]]], steps: int) -> None:
    """Print peak resident memory, one row per configuration, one column per shape."""
    shapes = list(memory)
    bench.say(f"peak resident memory (VmHWM, GB; one fresh process each, {steps} steps; "
              "in brackets: VmRSS after imports):")  # fmt: skip
    bench.say("  " + f"{'':10s}" + "".join(f"{s:>24s}" for s in shapes))
    for kind in KINDS:
        cells = [f"{memory[s][kind]['vmhwm'] / 1e9:.2f} ({memory[s][kind]['rss_imports'] / 1e9:.2f})"
                 for s in shapes]  # fmt: skip
        bench.say("  " + f"{kind:10s}" + "".join(f"{c:>24s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--shapes", nargs="+", choices=sorted(LORA_SHAPES),
                        default=list(LORA_SHAPES), help="which shapes (default: both)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=2, help="timed steps per contender a round")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--probe-steps", type=int, default=3,
                        help="steps each peak-memory process trains")  # fmt: skip
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)  # internal: memory probe
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe_dew(args)
        return
    bench = Bench("lora", args.cpus, args.threads)  # before jax starts: pins and thread flags
    results: dict[str, dict] = {}
    memory: dict[str, dict[str, dict[str, int]]] = {}
    for name in args.shapes:
        with tempfile.TemporaryDirectory() as directory:
            results[name] = time_shape(bench, name, args, directory)
            memory[name] = {kind: probe(kind, directory, args) for kind in KINDS}
    for name in args.shapes:
        report_shape(bench, name, args, results[name])
    memory_table(bench, memory, args.probe_steps)
    for out in results.values():
        out.pop("times")
    bench.finish({"args": vars(args), "shapes": {n: LORA_SHAPES[n] for n in args.shapes},
                  "lora": {"rank": RANK, "alpha": ALPHA, "targets": "q,k,v,o,gate,up,down"},
                  "results": results, "memory": memory})  # fmt: skip


if __name__ == "__main__":
    main()

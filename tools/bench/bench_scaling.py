"""Benchmark how SFT cost grows with model size and sequence length: Dew, TRL, a torch loop.

Run from the repository root with the workspace interpreter (the documented, pinned run):

    .venv/bin/python tools/bench/bench_scaling.py --rounds 3 --cpus 1 --threads 1
    .venv/bin/python tools/bench/bench_scaling.py --sizes small 50m --lengths   # sizes only
    .venv/bin/python tools/bench/bench_scaling.py --sizes 200m --lengths --remat full

Two sweeps of cells, each cell a random Qwen3 checkpoint that every contender loads (written
by tools/bench/trl_lora_step.py in the reference venv):

1. model size at a fixed ``--size-batch x --size-seq`` tokens a step (default 4 x 256):
   ``small`` (tools/bench/_shapes.py, 5.2M parameters), ``50m`` (width 512, 8 layers, MLP
   2048, vocab 32000) and ``200m`` (width 1024, 12 layers, MLP 3072, vocab 32000); the real
   parameter counts are printed;
2. sequence length at the small shape with ``--length-tokens`` tokens a step (default 4096):
   lengths 256, 1024 and 4096, the batch being tokens / length.

In each cell three contenders run in the same interleaved rounds (tools/bench/_rounds.py,
pinned to the same CPUs and thread count), plus the time the step's FLOPs (bench_sft's
``model_flops``) take at the same-round ``jnp.dot`` peak: Dew's compiled Trainer step
(``LMObjective`` + AdamW, bench_lora's ``build_dew``), TRL's SFTTrainer full fine-tuning with
gradient checkpointing OFF (trl_lora_step.py's worker, as bench_lora runs it) and a plain
torch loop (forward, backward, AdamW; bench_sft's loop, loading the shared checkpoint). After
the rounds, one fresh process per contender trains ``--probe-steps`` steps and reports Linux
``VmHWM``. With ``--remat full`` Dew also runs with each decoder layer checkpointed
(``remat="full"``) at the largest size asked for, timed and probed beside the plain step.

Record: tools/bench/results/scaling.json (``--record NAME``: results/NAME.json, for a subset).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import (  # noqa: E402
    WORKER_LOOP,
    Bench,
    Worker,
    add_arguments,
    jnp_dot_peak,
    ratio,
    reference_python,
    spread,
)
from _shapes import SHAPES  # noqa: E402
from bench_lora import TOKENIZER, WORKER, build_dew, probe, run_steps, status_bytes  # noqa: E402
from bench_sft import model_flops  # noqa: E402

SIZES = {
    "small": SHAPES["small"],
    "50m": dict(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    "200m": dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=64),
}  # fmt: skip
LENGTHS = (256, 1024, 4096)

TORCH_LOOP = (
    WORKER_LOOP
    + r"""
import statistics
import torch
from transformers import Qwen3ForCausalLM
threads = torch_threads(torch)
mode, directory, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import_rss = [l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]
m = Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32); m.train()
rows = torch.randint(1, m.config.vocab_size, (B * 16, T), generator=torch.Generator().manual_seed(1))
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
cursor = [0]
def torch_steps(steps):
    times = []
    for _ in range(steps):
        i = cursor[0] % 16; cursor[0] += 1
        ids = rows[i * B:(i + 1) * B]
        t = time.perf_counter()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return {"step_s": times}
if mode == "probe":
    torch_steps(int(sys.argv[5]))
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
    print(json.dumps({"vmhwm": int(hwm) * 1024, "rss_imports": int(import_rss) * 1024}))
else:
    torch_steps(1)  # warm-up
    serve({"steps": torch_steps}, {"torch": torch.__version__, "threads": threads})
"""
)
"""The plain torch loop of bench_sft, loading the cell's checkpoint: ``serve`` or ``probe``."""


def build_remat(directory: str, batch: int, seq: int) -> dict[str, Any]:
    """bench_lora's full Dew run (the Trainer takes the loaded weights over), with every
    decoder layer under ``remat="full"``."""
    import jax
    import numpy as np
    import optax

    from dew import models
    from dew.mesh import global_batch
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    pre = models.load_pretrained(directory)
    model = models.build("qwen3", config=dataclasses.replace(pre.model.config, remat="full"))
    objective = LMObjective(model, seq, pretrained=dict(pre.variables), ema_decay=None)
    trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                      devices=jax.devices()[:1], consume_pretrained=True)  # fmt: skip
    rng = np.random.default_rng(1)
    vocab = model.config.vocab_size
    placed = [global_batch({"text": rng.integers(1, vocab, (batch, seq + 1)).astype(np.int32)},
                           trainer.mesh) for _ in range(8)]  # fmt: skip
    step = trainer._step()
    start = time.perf_counter()
    state, metrics = step(trainer.initial_state(), placed[0])
    jax.block_until_ready(metrics)
    return {"step": step, "state": state, "placed": placed, "i": 1,
            "first_step_s": time.perf_counter() - start}  # fmt: skip


def probe_dew(args: argparse.Namespace) -> None:
    """Fresh-process mode: Dew's (or Dew remat's) VmHWM after ``--probe-steps`` steps."""
    import jax  # noqa: F401

    import dew.trainer  # noqa: F401

    rss_imports = status_bytes("VmRSS")
    if args.probe == "dew remat":
        run = build_remat(args.dir, args.batch, args.seq)
    else:
        run = build_dew(args.dir, "dew full", args.batch, args.seq)
    run_steps(run, args.probe_steps - 1)
    print(json.dumps({"vmhwm": status_bytes("VmHWM"), "rss_imports": rss_imports}), flush=True)


def probe_cell(kind: str, directory: str, batch: int, seq: int, steps: int) -> dict[str, int]:
    """One contender's ``{"vmhwm", "rss_imports"}`` bytes from a fresh process."""
    if kind == "torch loop":
        argv = [reference_python(), "-c", TORCH_LOOP, "probe", directory, str(batch), str(seq),
                str(steps)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"probe torch loop: exited {done.returncode}\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    if kind == "trl full":
        return probe(kind, directory, argparse.Namespace(batch=batch, seq=seq, probe_steps=steps))
    argv = [sys.executable, __file__, "--probe", kind, "--dir", directory, "--batch", str(batch),
            "--seq", str(seq), "--probe-steps", str(steps)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"probe {kind}: exited {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_cell(bench: Bench, label: str, cfg: dict, batch: int, seq: int, remat: bool,
             args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Write one cell's checkpoint, time its contenders in interleaved rounds, probe memory."""
    ref = reference_python()
    with tempfile.TemporaryDirectory() as directory:
        made = subprocess.run([ref, str(WORKER), "write", directory, json.dumps(cfg), str(seq)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        params = json.loads(made.stdout.strip().splitlines()[-1])["params"]
        print(f"  [{label}] {params / 1e6:.1f}M parameters, [{batch}, {seq}]", flush=True)
        workers = {"trl full": Worker([ref, str(WORKER), "serve", "full", directory, str(batch),
                                       str(seq), str(TOKENIZER)]),
                   "torch loop": Worker([ref, "-c", TORCH_LOOP, "serve", directory, str(batch),
                                         str(seq)])}  # fmt: skip
        try:
            runs = {"dew": build_dew(directory, "dew full", batch, seq)}
            if remat:
                runs["dew remat"] = build_remat(directory, batch, seq)
            flops = model_flops(params, cfg, batch, seq)
            contenders: dict[str, Any] = {
                **{k: (lambda r=r: run_steps(r, args.steps)) for k, r in runs.items()},
                **{k: (lambda w=w: w.ask(op="steps", steps=args.steps)["step_s"])
                   for k, w in workers.items()},
                "jnp.dot peak": jnp_dot_peak(flops)}  # fmt: skip
            times = bench.rounds(contenders, args.rounds, group=label)
            info = workers["trl full"].info
        finally:
            for w in workers.values():
                w.close()
        memory = {kind: probe_cell(kind, directory, batch, seq, args.probe_steps)
                  for kind in [*runs, "trl full", "torch loop"]}  # fmt: skip
    return {"params": params, "batch": batch, "seq": seq, "flops": flops, "times": times,
            "memory": memory, "versions": info,
            "first_step_s": {k: r["first_step_s"] for k, r in runs.items()}}  # fmt: skip


def kept_ratio(bench: Bench, label: str, num: list[float], den: list[float]) -> str:
    """A same-round ratio of medians, kept for the record; its cell text ``x (lo-hi)``."""
    r = ratio(label, num, den)
    bench.ratios.append(r)
    return f"{r.value:.2f} ({r.low:.2f}-{r.high:.2f})"


def report(bench: Bench, cells: dict[str, dict[str, Any]]) -> None:
    """The table: step time, share of peak, ratios and VmHWM per cell."""
    bench.say("SFT step (full fine-tuning, AdamW lr 1e-4, float32; TRL SFTTrainer with gradient "
              "checkpointing OFF); step ms median (min-max); VmHWM GB, one fresh process each")  # fmt: skip
    head = (f"  {'cell':14s}{'params':>8s}{'BxT':>9s}{'dew ms':>24s}{'peak%':>7s}"
            f"{'trl ms':>24s}{'torch ms':>24s}{'trl/dew':>18s}{'torch/dew':>18s}"
            f"{'GB dew':>8s}{'trl':>6s}{'torch':>6s}")  # fmt: skip
    bench.say(head)
    for label, c in cells.items():
        t, m = c["times"], c["memory"]
        dew, peak = spread(t["dew"]), spread(t["jnp.dot peak"])
        trl_r = kept_ratio(bench, f"{label}: trl / dew", t["trl full"], t["dew"])
        torch_r = kept_ratio(bench, f"{label}: torch / dew", t["torch loop"], t["dew"])
        bench.say(
            f"  {label:14s}{c['params'] / 1e6:7.1f}M{c['batch']:>4d}x{c['seq']:<4d}"
            f"{dew.text(1e3):>24s}{100 * peak.median / dew.median:6.0f}%"
            f"{spread(t['trl full']).text(1e3):>24s}{spread(t['torch loop']).text(1e3):>24s}"
            f"{trl_r:>18s}{torch_r:>18s}{m['dew']['vmhwm'] / 1e9:8.2f}"
            f"{m['trl full']['vmhwm'] / 1e9:6.2f}{m['torch loop']['vmhwm'] / 1e9:6.2f}"
        )
        if "dew remat" in t:
            bench.say(f"  {'':14s}dew remat full: {spread(t['dew remat']).text(1e3)} ms, VmHWM "
                      f"{m['dew remat']['vmhwm'] / 1e9:.2f} GB (plain dew "
                      f"{dew.text(1e3)} ms, {m['dew']['vmhwm'] / 1e9:.2f} GB)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--sizes", nargs="*", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--lengths", nargs="*", type=int, default=list(LENGTHS))
    parser.add_argument("--size-batch", type=int, default=4)
    parser.add_argument("--size-seq", type=int, default=256)
    parser.add_argument("--length-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=1, help="timed steps per contender a round")
    parser.add_argument("--probe-steps", type=int, default=2)
    parser.add_argument("--remat", choices=("none", "full"), default="none",
                        help="full: also time Dew with remat='full' at the largest size")  # fmt: skip
    parser.add_argument("--record", default="scaling",
                        help="record name: tools/bench/results/<record>.json")  # fmt: skip
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)  # internal: memory probe
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe_dew(args)
        return
    bench = Bench(args.record, args.cpus, args.threads)  # before jax starts: pins, thread flags
    cells: dict[str, dict[str, Any]] = {}
    largest = args.sizes[-1] if args.sizes else None
    try:
        for name in args.sizes:
            cells[f"size {name}"] = run_cell(bench, f"size {name}", SIZES[name], args.size_batch,
                                             args.size_seq, args.remat == "full" and
                                             name == largest, args)  # fmt: skip
        for seq in args.lengths:
            batch = max(1, args.length_tokens // seq)
            cells[f"length {seq}"] = run_cell(bench, f"length {seq}", SIZES["small"], batch, seq,
                                              False, args)  # fmt: skip
    finally:
        if cells:
            finish(bench, args, cells, largest)


def finish(bench: Bench, args: argparse.Namespace, cells: dict, largest: str | None) -> None:
    """Print the table and the memory verdict, write the record (also after a partial run)."""
    report(bench, cells)
    size_cell = cells.get(f"size {largest}")
    if size_cell is not None:
        dew, trl = size_cell["memory"]["dew"]["vmhwm"], size_cell["memory"]["trl full"]["vmhwm"]
        bench.say(f"largest size ({largest}): Dew's VmHWM {dew / 1e9:.2f} GB is "
                  f"{'at most' if dew <= trl else 'ABOVE'} TRL's {trl / 1e9:.2f} GB")  # fmt: skip
    v = next(iter(cells.values()))["versions"]
    bench.say(f"torch {v['torch']} ({v['threads']} threads), TRL {v['trl']}, transformers "
              f"{v['transformers']}; {args.rounds} rounds x {args.steps} steps, interleaved; "
              f"cells run: {', '.join(cells)}")  # fmt: skip
    for c in cells.values():
        c.pop("times")
    bench.finish({"args": vars(args), "sizes": SIZES, "cells": cells})


if __name__ == "__main__":
    main()

"""Benchmark Dew's diffusion-LM training steps (MDLM, BD3-LM) against the references' in torch.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_diffusion_step.py [--rounds 3] [--steps 2] \
        [--blocks 4,16] [--cpus 1] [--threads 1]

Shape: the harness's ``small`` Qwen3 (tools/bench/_shapes.py: 5.18M parameters, 4 layers,
width 256, 4 heads, 2 KV heads, head_dim 64, MLP 1088, vocab 4096, tied), ``--batch`` 8 rows
of ``--seq`` 256 tokens; the mask id is the last vocabulary id (4095) and the data draws
from the other 4095. BD3-LM's pass reads ``[x_t, x_0]``, so its decoder sees 512 rows.

The torch side (tools/bench/torch_diffusion_step.py, in the reference venv of
tools/reference_env.sh) writes a random checkpoint of that shape and keeps serving: the
MDLM step and the BD3-LM step (one per ``--blocks`` size) with the references' verbatim loss
code (kuleshov-group/mdlm ``c112c52``, kuleshov-group/bd3lms ``1c3e8f4``, checked against
their pinned blobs) on the transformers Qwen3 decoder with sdpa attention, BD3-LM's
``block_diff_mask`` as its ``[2L, 2L]`` boolean mask; and torch's float32 matmul peak. That
worker's docstring says why it is this decoder and not the references' DiT. Dew loads the
same checkpoint (``dew.models.load_pretrained``) and times its compiled Trainer step (AdamW,
lr 1e-4) with ``MaskedDiffusionObjective`` and with ``BlockDiffusionObjective`` at each block
size (the decoder's ``two_copy=True`` pass), beside the ``jnp.dot`` peak.

Every contender runs in the same interleaved rounds (tools/bench/_rounds.py), pinned to the
same CPUs with the same thread count; a round's value is the median of ``--steps`` steps.
Printed: median and spread per contender; ratios reference / Dew of step time (above 1: Dew
faster; goal 1.0) with the per-round spread and a verdict; each Dew step's share of the
same-round ``jnp.dot`` peak (FLOPs: ``6 x parameters x tokens`` plus dense attention, see
``step_flops``); the first step's time (compile + run). Record:
tools/bench/results/diffusion_step.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, Worker, add_arguments, jnp_dot_peak, reference_python, spread  # noqa: E402
from _shapes import SHAPES  # noqa: E402
from bench_lora import run_steps  # noqa: E402

HERE = Path(__file__).resolve().parent
GOAL = 1.0
SHAPE = "small"


def step_flops(params: int, cfg: dict, b: int, n: int, two_copy: bool) -> float:
    """Training FLOPs of one step (forward + backward = 3 x forward).

    MDLM: ``6 P B L`` plus bidirectional attention, ``12 layers H Dh L^2 B``. BD3-LM: the body
    (``P`` less the tied ``V x D`` embedding) over ``2L`` rows, the head over the ``L``
    noised rows, and the dense ``2L x 2L`` attention both sides compute (the mask only hides
    entries). An estimate for the peak-share line, not a count of either program's work.
    """
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    attn = 12 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * cfg["head_dim"]
    if not two_copy:
        return 6.0 * params * b * n + attn * n * n * b
    head = v * d
    rows = 2 * n
    return 6.0 * (params - head) * b * rows + 6.0 * head * b * n + attn * rows * rows * b


def dew_side(directory: str, args: argparse.Namespace, blocks: list[int]):  # type: ignore[no-untyped-def]
    """Dew's compiled Trainer steps on the checkpoint in ``directory``.

    Returns ``(runs, call)``: ``runs[name]`` holds the step, state, placed batches and the
    first step's time; ``call(name)`` is a round's callable (``--steps`` timed steps).
    """
    import jax
    import numpy as np
    import optax

    from dew import models
    from dew.mesh import global_batch
    from dew.objectives.block_diffusion import BlockDiffusionObjective
    from dew.objectives.masked_diffusion import MaskedDiffusionObjective
    from dew.trainer import Trainer

    cfg, b, n = SHAPES[SHAPE], args.batch, args.seq
    mask_id = cfg["vocab_size"] - 1
    pre = models.load_pretrained(directory)
    rng = np.random.default_rng(1)
    batches = [{"text": rng.integers(0, mask_id, (b, n + 1)).astype(np.int32)} for _ in range(8)]
    common = dict(mask_id=mask_id, real_tokens=mask_id, pretrained=dict(pre.variables))
    objectives = {"dew mdlm": MaskedDiffusionObjective(pre.model, n, **common)}
    for size in blocks:
        objectives[f"dew bd3lm S={size}"] = BlockDiffusionObjective(
            pre.model, n, block_size=size, **common
        )
    runs: dict[str, dict] = {}
    for name, objective in objectives.items():
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

    def call(name: str):  # type: ignore[no-untyped-def]
        return lambda: run_steps(runs[name], args.steps)

    return runs, call


def report(bench: Bench, times: dict, flops: dict, blocks: list[int]) -> None:
    """The ratio lines: reference / Dew per objective, and each Dew step's peak share."""
    pairs = [("mdlm", "torch mdlm", "dew mdlm")] + [
        (f"bd3lm S={s}", f"torch bd3lm S={s}", f"dew bd3lm S={s}") for s in blocks
    ]
    for label, ref, ours in pairs:
        bench.compare(f"{label}: reference torch / dew (step time)", times[ref], times[ours], GOAL)
    peak = times["jnp.dot peak"]  # seconds MDLM's FLOPs take at the same-round peak
    for label, _, ours in pairs:
        scale = flops[label] / flops["mdlm"]
        bench.compare(f"{label}: dew share of same-round jnp.dot peak",
                      [p * scale for p in peak], times[ours])  # fmt: skip
    for s in blocks:
        bench.compare(f"bd3lm S={s} / mdlm step time (dew)", times[f"dew bd3lm S={s}"],
                      times["dew mdlm"])  # fmt: skip
        bench.compare(f"bd3lm S={s} / mdlm step time (torch)", times[f"torch bd3lm S={s}"],
                      times["torch mdlm"])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per contender a round")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--blocks", default="4,16", help="BD3-LM block sizes, dividing --seq")
    args = parser.parse_args()
    blocks = [int(s) for s in args.blocks.split(",") if s]
    bench = Bench("diffusion_step", args.cpus, args.threads)  # before jax starts

    import jax

    cfg, b, n = SHAPES[SHAPE], args.batch, args.seq
    with tempfile.TemporaryDirectory() as directory:
        worker = Worker([reference_python(), str(HERE / "torch_diffusion_step.py"), directory,
                         str(b), str(n), json.dumps(cfg), args.blocks])  # fmt: skip
        try:
            info = worker.info
            runs, call = dew_side(directory, args, blocks)
            flops = {"mdlm": step_flops(info["params"], cfg, b, n, False)}
            flops.update({f"bd3lm S={s}": step_flops(info["params"], cfg, b, n, True)
                          for s in blocks})  # fmt: skip
            contenders = {"torch mdlm": lambda: worker.ask(op="mdlm", steps=args.steps)["step_s"]}
            for s in blocks:
                contenders[f"torch bd3lm S={s}"] = lambda s=s: worker.ask(
                    op=f"bd3lm_{s}", steps=args.steps
                )["step_s"]
            contenders.update({name: call(name) for name in runs})
            contenders["jnp.dot peak"] = jnp_dot_peak(flops["mdlm"])
            contenders["torch matmul peak"] = lambda: (
                flops["mdlm"] / worker.ask(op="peak", reps=10)["flops_per_s"]
            )
            for fn in contenders.values():  # one untimed pass: warm caches and allocators
                fn()
            times = bench.rounds(contenders, args.rounds)
        finally:
            worker.close()
    bench.say(
        f"model: Qwen3 '{SHAPE}' {info['params'] / 1e6:.2f}M parameters, [{b}, {n}] tokens per "
        f"step (BD3-LM: [{b}, {2 * n}] rows through the decoder), AdamW, float32; torch "
        f"{info['torch']} ({info['threads']} threads, sdpa), transformers "
        f"{info['transformers']}, mdlm@{info['mdlm_commit'][:7]}, "
        f"bd3lms@{info['bd3lm_commit'][:7]}; JAX {jax.__version__} on "
        f"{jax.devices()[0].platform}; {args.rounds} rounds x {args.steps} steps, interleaved"
    )
    bench.say("step time per contender (peaks: the time MDLM's step FLOPs take at that peak):")
    for name, values in times.items():
        bench.show(name, values, extra=f"{b * n / spread(values).median:9.0f} tokens/s")
    report(bench, times, flops, blocks)
    for name, run in runs.items():
        bench.say(f"  first step (compile + run) {name}: {run['first_step_s']:.2f} s")
    bench.finish({"args": vars(args), "shape": SHAPE, "reference": info, "step_flops": flops,
                  "first_step_s": {k: r["first_step_s"] for k, r in runs.items()}})  # fmt: skip


if __name__ == "__main__":
    main()

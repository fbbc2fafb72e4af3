"""Where the time of Dew's compiled SFT step goes: a per-op profile, grouped.

Builds the SFT step the SFT bench times (``LMObjective`` + AdamW through ``Trainer``, a random
Qwen3 of ``--shape``, batch ``--batch`` x ``--seq``), runs it under ``jax.profiler.trace``
with a Perfetto trace, and reads back the time of every XLA operation (one event per thunk
on CPU). Each operation is looked up in the compiled HLO text, which says what it computes
(a matrix product, or a fusion around one, or everything else) and where it came from (the
``op_name`` metadata: forward or backward pass, attention, MLP, norms, embedding and head,
the optimizer update). Printed per group: milliseconds per step and share of the traced
operation time; then the matrix products' rate against the same process's ``jnp.dot`` peak
(model FLOPs over the time spent in products) and the slowest operations that are not
products. The same products are then timed outside the step (``_products.py``): each shape
alone with its operands cache-warm, and all of them together on operands of their own, the
step with every other operation removed. It is a diagnosis, not a contest: no peer runs here
(``bench_sft.py`` compares).

    .venv/bin/python tools/bench/profile_step.py [--shape small] [--batch 8] [--seq 256]
        [--steps 3] [--cpus 1] [--threads 1]

``--shape tiny --batch 32 --seq 63`` runs the same LM step at the shapes of the GRPO step
bench's update (its policy's forward and backward over 8 prompts x 4 samples of 63 tokens;
the update's forward of the reference model runs dots of the same shapes): GRPO's loss only
changes the elementwise work around the products.

Record: tools/bench/results/profile_step.json (``profile_step_<shape>.json`` for a shape
other than ``small``).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _products import isolated_products, products_together  # noqa: E402
from _rounds import Bench, add_arguments, jnp_dot_peak  # noqa: E402
from _shapes import SHAPES  # noqa: E402

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\s([a-z][\w\-]*)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_SHAPED = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r"=\s*\w+\[[\d,]*\]\S*\s+dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)$")
_DIMS = re.compile(
    r"(lhs_batch_dims|rhs_batch_dims|lhs_contracting_dims|rhs_contracting_dims)=\{([\d,]*)\}"
)
PARTS = (("self_attn", "attention"), ("mlp", "mlp"), ("layernorm", "norms"),
         ("norm", "norms"), ("embed_tokens", "embedding+head"), ("logits", "embedding+head"))  # fmt: skip


def parse_hlo(text: str) -> dict[str, dict]:
    """``name -> {op, op_name, matmul, dots}`` for every instruction of the compiled module; a
    fusion counts as a matrix product when its computation holds a dot or a convolution;
    ``dots`` lists the operand shapes and dimension numbers of the dots it runs."""
    computations: dict[str, list[str]] = collections.defaultdict(list)
    current = ""
    info: dict[str, dict] = {}
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    dots: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    for line in text.splitlines():
        shaped = _SHAPED.match(line)
        if shaped:
            dims = tuple(int(d) for d in shaped.group(3).split(",") if d)
            shapes[shaped.group(1)] = (shaped.group(2), dims)
        dot = _DOT.search(line)
        if dot and shaped:
            dots[current].append(dot.groups())
            dots["%" + shaped.group(1)].append(dot.groups())
        head = _COMPUTATION.match(line)
        if head and line.rstrip().endswith("{"):
            current = head.group(1)
            continue
        found = _INSTRUCTION.match(line)
        if not found:
            continue
        name, op = found.groups()
        computations[current].append(op)
        calls = _CALLS.search(line)
        op_name = _OP_NAME.search(line)
        info[name] = {"op": op, "calls": calls.group(1) if calls else "",
                      "op_name": op_name.group(1) if op_name else ""}  # fmt: skip
    for entry in info.values():
        inner = computations.get(entry["calls"], [])
        entry["matmul"] = entry["op"] in ("dot", "convolution") or any(
            op in ("dot", "convolution") for op in inner
        )
    for name, entry in info.items():  # a dot itself, or the dots inside a fusion's body
        found = dots.get("%" + name, []) if entry["op"] == "dot" else dots.get(entry["calls"], [])
        entry["dots"] = [_dot_spec(lhs, rhs, attrs, shapes) for lhs, rhs, attrs in found]
    return info


def _dot_spec(lhs: str, rhs: str, attrs: str, shapes: dict) -> dict:
    """Operand dtypes and shapes and the dimension numbers of one HLO dot."""
    dims = {
        key: tuple(int(d) for d in value.split(",") if d) for key, value in _DIMS.findall(attrs)
    }
    return {"lhs": shapes.get(lhs), "rhs": shapes.get(rhs), "dims": dims}


def group_of(entry: dict) -> tuple[str, str, str]:
    """``(phase, part, kind)`` of an instruction from its op_name metadata."""
    op_name = entry["op_name"]
    if "transpose(jvp(" in op_name:
        phase = "backward"
    elif "jvp(" in op_name:
        phase = "forward"
    else:
        phase = "update+glue"
    part = next((label for key, label in PARTS if key in op_name), "other")
    return phase, part, "matmul" if entry["matmul"] else "other ops"


def op_times(trace_dir: str, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds and runs per step of every traced operation (Perfetto 'X' events), by name."""
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz"))
    events = json.load(gzip.open(files[-1]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    total: dict[str, float] = collections.Counter()
    runs: dict[str, float] = collections.Counter()
    for event in events:
        if event.get("ph") == "X":
            total[event["name"]] += event.get("dur", 0) * 1e-6 / steps
            runs[event["name"]] += 1 / steps
    return dict(total), dict(runs)


def build_step(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The compiled Trainer step, its state, a placed batch and the model's FLOPs a step."""
    import jax
    import numpy as np
    import optax

    from dew import models
    from dew.mesh import global_batch
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    shape = SHAPES[args.shape]
    model = models.build(
        "qwen3", vocab_size=shape["vocab_size"], emb_features=shape["hidden_size"],
        mlp_features=shape["intermediate_size"], num_layers=shape["num_hidden_layers"],
        num_heads=shape["num_attention_heads"], num_kv_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"], qk_norm=True,
    )  # fmt: skip
    objective = LMObjective(model, args.seq, ema_decay=None)
    trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0),
                      devices=jax.devices()[:1])  # fmt: skip
    state = trainer.initial_state()
    tokens = np.random.default_rng(1).integers(1, shape["vocab_size"], (args.batch, args.seq + 1))
    batch = global_batch({"text": tokens.astype(np.int32)}, trainer.mesh)
    params = sum(x.size for x in jax.tree.leaves(state.params))
    heads, head_dim = shape["num_attention_heads"], shape["head_dim"]
    attention = 6 * shape["num_hidden_layers"] * heads * head_dim * args.seq * args.batch * args.seq
    flops = 6.0 * params * args.batch * args.seq + attention
    return trainer._step(), state, batch, flops


def report(bench: Bench, info: dict, times: dict[str, float], step_s: float, flops: float,
           peak: float) -> dict:  # fmt: skip
    """Print the grouped table, the products' rate and the slowest other ops; return them."""
    groups: dict[tuple, float] = collections.Counter()
    others: list[tuple[float, str, str]] = []
    for name, seconds in times.items():
        if name not in info:
            continue
        key = group_of(info[name])
        groups[key] += seconds
        if key[2] != "matmul":
            others.append((seconds, name, info[name]["op_name"]))
    traced = sum(groups.values())
    bench.say(f"step {step_s * 1e3:.1f} ms wall; traced operations {traced * 1e3:.1f} ms")
    bench.say(f"{'phase':12s} {'part':15s} {'kind':10s} {'ms/step':>9s} {'share':>6s}")
    for (phase, part, kind), seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
        bench.say(f"{phase:12s} {part:15s} {kind:10s} {seconds * 1e3:9.2f} {seconds / traced:6.1%}")
    matmul = sum(s for k, s in groups.items() if k[2] == "matmul")
    rate = flops / matmul if matmul else 0.0
    bench.say(f"matrix products: {matmul * 1e3:.1f} ms for {flops / 1e9:.2f} GFLOP = "
              f"{rate / 1e9:.1f} GFLOP/s; jnp.dot peak {peak / 1e9:.1f} GFLOP/s "
              f"({rate / peak:.2f} of it); at the peak the step would take "
              f"{(flops / peak + traced - matmul) * 1e3:.1f} ms with the other ops as they are")  # fmt: skip
    bench.say("slowest operations that are not products:")
    for seconds, name, op_name in sorted(others, reverse=True)[:12]:
        bench.say(f"  {seconds * 1e3:7.2f} ms  {name:28s} {op_name[:90]}")
    return {"groups": {"/".join(k): v for k, v in groups.items()}, "traced_s": traced,
            "matmul_s": matmul, "flops": flops, "peak_flops": peak, "step_s": step_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="traced steps")
    args = parser.parse_args()
    # another shape keeps its own record beside the small one's
    name = "profile_step" if args.shape == "small" else f"profile_step_{args.shape}"
    bench = Bench(name, args.cpus, args.threads)
    import jax

    step, state, batch, flops = build_step(args)
    for _ in range(2):  # compile and warm up
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    info = parse_hlo(step.lower(state, batch).compile().as_text())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(args.steps):
                state, metrics = step(state, batch)
                jax.block_until_ready(metrics)
        step_s = (time.perf_counter() - start) / args.steps
        times, runs = op_times(trace_dir, args.steps)
    at_peak = jnp_dot_peak(flops)  # seconds the FLOPs take at the peak: best of three
    peak = flops / min(at_peak() for _ in range(3))
    payload = report(bench, info, times, step_s, flops, peak)
    alone = isolated_products(info, times, runs)
    bench.say(f"the same products alone ({alone['shapes']} shapes, {alone['flops'] / 1e9:.2f} "
              f"GFLOP): {alone['alone_s'] * 1e3:.1f} ms against {alone['in_step_s'] * 1e3:.1f} ms "
              f"in the step ({alone['alone_s'] / alone['in_step_s']:.2f}); alone they run at "
              f"{alone['flops'] / alone['alone_s'] / peak:.2f} of the square jnp.dot peak")  # fmt: skip
    together = products_together(info, times, runs)
    bench.say(f"the same products together ({together['products']} dots a turn, each on operands "
              f"of its own): {together['together_s'] * 1e3:.1f} ms, "
              f"{together['flops'] / together['together_s'] / peak:.2f} of the square peak; with "
              f"every other operation gone the step would run at "
              f"{flops / together['together_s'] / peak:.2f} of it")  # fmt: skip
    bench.say(
        f"{'product (contracted dims marked)':44s} {'in step':>9s} {'alone':>9s} {'GFLOP/s':>8s}"
    )
    for label, in_step, alone_s, gflop in alone["by_shape"][:10]:
        bench.say(f"{label:44s} {in_step * 1e3:8.1f}ms {alone_s * 1e3:8.1f}ms "
                  f"{gflop / max(in_step, 1e-12) / 1e9:8.1f}")  # fmt: skip
    bench.finish({"args": vars(args), **payload, "isolated_products": alone,
                  "products_together": together})  # fmt: skip


if __name__ == "__main__":
    main()

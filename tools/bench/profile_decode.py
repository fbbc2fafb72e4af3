"""Where the time of the ``Server``'s decode and of a prefill goes: per-op profiles of their
compiled programs.

Serves the work ``bench_generation.py`` times for Dew (a random Qwen3 of ``--shape``, batch
``B`` requests of ``--prompt`` ids, ``--new-tokens`` each, greedy, ``steps_per_call`` decode
steps per compiled call) at each batch of ``--batches``: first untraced (best of ``--repeats``
walls), then once under ``jax.profiler.trace``. Every traced XLA operation (one event per
thunk on CPU) is looked up in its program's compiled HLO (``profile_step.parse_hlo``: a
matrix product or not, and the ``op_name`` it came from) and grouped by program (``admit``:
the prefill and first draw, ``decode``: the loop of steps) and by part: the output head
``[B, D] x [D, V]``, the MLP, the attention projections (q/k/v/o with the q/k norms and
rotary), the attention over the cache window (scores, softmax, values), the cache write (the
per-row scatter of the new key and value), the norms, the draw (log-softmax, argmax) with
the loop's bookkeeping, and operations without metadata. The wall time the traced
operations do not cover is the host's (scheduling, dispatch, copies to the host).

The decode step's products are then timed outside it (``_products.py``): each shape alone
in a loop of its own (operands cache-warm), and all of them together in one loop, each on
operands of its own so the weights stream as in the step; each gives the share of the peak a
step would reach with only its products left.

Last, the prefill forward ``bench_generation.py`` times (``--prefill``, 8 x 512 ids): its
traced operations grouped by part (``profile_step.group_of``) and its products run together,
so the share of the peak its products alone would allow stands beside the share it reaches.

Tracing adds a fixed cost to every operation, so small operations weigh more in the traced
shares than in an untraced step; the untraced wall and the products' rate are printed
beside them. It is a diagnosis, not a contest: no peer runs here.

    .venv/bin/python tools/bench/profile_decode.py [--batches 8,32] [--cpus 1] [--threads 1]

Record: tools/bench/results/profile_decode.json.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _products import isolated_products, products_together  # noqa: E402
from _rounds import Bench, add_arguments, jnp_dot_peak  # noqa: E402
from _shapes import SHAPES  # noqa: E402
from profile_step import group_of, op_times, parse_hlo  # noqa: E402

CONTAINERS = ("while", "call", "conditional")  # their events enclose the operations inside


def part_of(entry: dict) -> str:
    """The part of the decode step an instruction belongs to, from its ``op_name``."""
    name, op = entry["op_name"], entry["op"]
    if not name:
        return "unlabelled"
    if "logits_from_hidden" in name:
        return "head"
    if "embed_tokens" in name:
        return "embedding"
    if "/mlp/" in name:
        return "mlp"
    if "self_attn" in name:
        if "_project" in name or "o_proj" in name:
            return "attn projections"
        if "scatter" in name or "gather" in name or op in ("scatter", "gather"):
            return "cache write"
        return "attn over cache"
    if "layernorm" in name or "/norm/" in name:
        return "norms"
    if "CausalTransformer" in name:
        return "model other"
    return "draw+loop"


def module_times(trace_dir: str) -> tuple[dict[str, dict[str, float]], dict, float]:
    """Seconds and runs of every traced operation, by program (``hlo_module``) then operation
    name, and the seconds of the traced Python call to ``serve`` (0 when the trace lacks it)."""
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz"))
    events = json.load(gzip.open(files[-1]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    out: dict[str, dict[str, float]] = collections.defaultdict(collections.Counter)
    runs: dict[str, dict[str, float]] = collections.defaultdict(collections.Counter)
    serve = 0.0
    for event in events:
        if event.get("ph") != "X":
            continue
        module = event.get("args", {}).get("hlo_module")
        if module:
            out[module][event["name"]] += event.get("dur", 0) * 1e-6
            runs[module][event["name"]] += 1
        elif event["name"].startswith("$") and event["name"].endswith(" serve"):
            serve = max(serve, event.get("dur", 0) * 1e-6)
    return out, runs, serve


def build_model(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """A random Qwen3 of ``--shape`` (tied head, q/k norms) and its variables."""
    import jax
    import numpy as np

    from dew import models

    shape = SHAPES[args.shape]
    model = models.build(
        "qwen3", vocab_size=shape["vocab_size"], emb_features=shape["hidden_size"],
        mlp_features=shape["intermediate_size"], num_layers=shape["num_hidden_layers"],
        num_heads=shape["num_attention_heads"], num_kv_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"], qk_norm=True, tie_embeddings=True,
    )  # fmt: skip
    return model, model.init(jax.random.key(0), np.zeros((1, 8), np.int32))


def build_server(args: argparse.Namespace, batch: int):  # type: ignore[no-untyped-def]
    """A ``Server`` of ``batch`` slots on a random model, and the work to serve (a callable)."""
    import numpy as np

    from dew.inference import Server
    from dew.sampling import Sampling

    shape = SHAPES[args.shape]
    model, variables = build_model(args)
    server = Server(model, variables, slots=batch, capacity=args.prompt + args.new_tokens,
                    sampling=Sampling(temperature=0.0), steps_per_call=args.steps_per_call)  # fmt: skip
    prompts = np.random.default_rng(1).integers(1, shape["vocab_size"], (batch, args.prompt))

    def serve() -> None:
        for prompt in prompts:
            server.submit(prompt, args.new_tokens)
        done = server.run()
        assert sum(len(c.ids) for c in done.values()) == batch * args.new_tokens

    return server, serve


def decode_flops(args: argparse.Namespace, batch: int, window: int) -> float:
    """Matrix-product FLOPs of one decode step: the layers' and the head's kernels for each
    row, and attention scores and values over the ``window`` cache slots."""
    s = SHAPES[args.shape]
    d, h, kv, dh = (
        s["hidden_size"],
        s["num_attention_heads"],
        s["num_key_value_heads"],
        s["head_dim"],
    )
    layer = d * (h + 2 * kv) * dh + h * dh * d + 3 * d * s["intermediate_size"]
    kernels = s["num_hidden_layers"] * layer + d * s["vocab_size"]
    attention = 4 * s["num_hidden_layers"] * h * dh * window
    return batch * (2.0 * kernels + attention)


def profile(bench: Bench, args: argparse.Namespace, batch: int, peak: float) -> dict:
    """Profile one batch; print and return its table."""
    import jax

    server, serve = build_server(args, batch)
    serve()  # compile admission and decode
    walls = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        serve()
        walls.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            serve()
        times, runs, traced_wall = module_times(trace_dir)
    infos = {key[0]: parse_hlo(p.as_text()) for key, p in server.programs._programs.items()}
    window = next(key[1] for key in server.programs._programs if key[0] == "decode")
    steps = args.new_tokens - 1  # the first id comes from the admission
    groups: dict[tuple[str, str, str], float] = collections.Counter()
    for module, ops in times.items():
        program = next((p for p in infos if p in module), None)
        for name, seconds in ops.items():
            entry = (infos[program] if program else {}).get(name)
            if entry is None or entry["op"] in CONTAINERS:
                continue
            part = part_of(entry) if program == "decode" else "all"
            groups[(program or module, part, "matmul" if entry["matmul"] else "other")] += seconds
    traced = sum(groups.values())
    wall = min(walls)
    bench.say(f"B={batch}: serve {wall * 1e3:.1f} ms untraced (best of {args.repeats}), "
              f"{traced_wall * 1e3:.1f} ms traced, of which operations {traced * 1e3:.1f} ms "
              f"and host {(traced_wall - traced) * 1e3:.1f} ms; {steps} decode steps, "
              f"window {window}")  # fmt: skip
    bench.say(f"  {'program':8s} {'part':17s} {'kind':7s} {'ms/step':>8s} {'share':>6s}")
    for (program, part, kind), seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
        per = seconds / steps if program == "decode" else seconds
        unit = "" if program == "decode" else " (whole)"
        bench.say(f"  {program:8s} {part:17s} {kind:7s} {per * 1e3:8.3f} "
                  f"{seconds / traced:6.1%}{unit}")  # fmt: skip
    products = sum(s for k, s in groups.items() if k[0] == "decode" and k[2] == "matmul")
    flops = decode_flops(args, batch, window) * steps
    bench.say(f"  decode products: {flops / products / 1e9:.1f} GFLOP/s traced, jnp.dot peak "
              f"{peak / 1e9:.1f} GFLOP/s ({flops / products / peak:.2f} of it)")  # fmt: skip
    alone = products_alone(bench, infos, times, runs, steps, flops, peak)
    return {"serve_s": wall, "serve_walls": walls, "traced_wall_s": traced_wall,
            "traced_ops_s": traced, "steps": steps, "window": window, "decode_flops": flops,
            "groups": {"/".join(k): v for k, v in groups.items()},
            "isolated_products": alone}  # fmt: skip


def products_alone(bench: Bench, infos: dict, times: dict, runs: dict, steps: int,
                   flops: float, peak: float) -> dict:  # fmt: skip
    """The decode program's products timed outside it (``_products``), per step. Alone: what
    the step's product shapes cost at XLA's own rate, each in a loop of its own with its
    operands in the CPU's caches; with every other operation gone and each product at that
    rate, a step would reach ``flops / peak / alone`` of the square ``jnp.dot`` peak, an
    upper bound for these shapes (the step reads each layer's weights in turn, so they are
    not all cache-warm). Together: all of the step's products in one loop, each on operands
    of its own, so the weights stream as they do in the step; the share of the peak it
    prints bounds what the step would reach with only its products left."""
    module = next(m for m in times if "decode" in m)
    per_step = {name: s / steps for name, s in times[module].items()}
    count = {name: n / steps for name, n in runs[module].items()}
    alone = isolated_products(infos["decode"], per_step, count)
    bound = flops / steps / peak / alone["alone_s"]
    bench.say(f"  decode products alone ({alone['shapes']} shapes): {alone['alone_s'] * 1e3:.3f} "
              f"ms/step against {alone['in_step_s'] * 1e3:.3f} in the step; at their alone "
              f"rates and with nothing else, a step would run at {bound:.2f} of the peak")  # fmt: skip
    for label, in_step, alone_s, _ in alone["by_shape"][:6]:
        bench.say(f"    {label:40s} {in_step * 1e3:7.3f} ms in step {alone_s * 1e3:7.3f} ms alone")
    together = products_together(infos["decode"], per_step, count)
    streamed = flops / steps / peak / together["together_s"]
    bench.say(f"  decode products together ({together['products']} dots a turn, each on operands "
              f"of its own, as the step reads each layer's weights in turn): "
              f"{together['together_s'] * 1e3:.3f} ms/step; with nothing else, a step would run "
              f"at {streamed:.2f} of the peak")  # fmt: skip
    return {**alone, "bound_share_of_peak": bound, "together_s": together["together_s"],
            "together_share_of_peak": streamed}  # fmt: skip


def profile_prefill(bench: Bench, args: argparse.Namespace, peak: float) -> dict:
    """The prefill forward ``bench_generation.py`` times (``--prefill`` rows x length ids, every
    row full): untraced best of ``--repeats``, then three traced runs grouped by part, and its
    products timed outside it. Its share of the peak counts the dots it runs (from the HLO:
    the head at each row's last token only)."""
    import jax
    import numpy as np

    rows, length = args.prefill
    model, variables = build_model(args)
    ids = np.random.default_rng(1).integers(1, SHAPES[args.shape]["vocab_size"], (rows, length))
    ids, lengths = ids.astype(np.int32), np.full((rows,), length, np.int32)
    prefill = jax.jit(lambda v, i, n: model.apply(v, i, n, length, method="prefill"))
    info = parse_hlo(prefill.lower(variables, ids, lengths).compile().as_text())
    walls = []
    for _ in range(args.repeats + 1):  # the first compiles
        start = time.perf_counter()
        jax.block_until_ready(prefill(variables, ids, lengths))
        walls.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(3):
                jax.block_until_ready(prefill(variables, ids, lengths))
        times, runs = op_times(trace_dir, 3)
    groups: dict[tuple[str, str], float] = collections.Counter()
    for name, seconds in times.items():
        if name in info and info[name]["op"] not in CONTAINERS:
            groups[group_of(info[name])[1:]] += seconds
    wall, traced = min(walls[1:]), sum(groups.values())
    together = products_together(info, times, runs)
    flops = together["flops"]
    bench.say(f"prefill [{rows}, {length}]: {wall * 1e3:.1f} ms untraced (best of {args.repeats}),"
              f" traced operations {traced * 1e3:.1f} ms; {flops / 1e9:.2f} GFLOP in its dots, "
              f"{flops / wall / peak:.2f} of the peak")  # fmt: skip
    bench.say(f"  {'part':15s} {'kind':10s} {'ms':>8s} {'share':>6s}")
    for (part, kind), seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
        bench.say(f"  {part:15s} {kind:10s} {seconds * 1e3:8.2f} {seconds / traced:6.1%}")
    bench.say(f"  prefill products: {together['in_step_s'] * 1e3:.1f} ms in it, together "
              f"{together['together_s'] * 1e3:.1f} ms ({together['products']} dots, each on "
              f"operands of its own); with only its products, a prefill would run at "
              f"{flops / together['together_s'] / peak:.2f} of the peak")  # fmt: skip
    return {"wall_s": wall, "walls": walls, "traced_ops_s": traced, "flops": flops,
            "groups": {"/".join(k): v for k, v in groups.items()}, "products_together": together}  # fmt: skip


def rows_by_length(text: str) -> tuple[int, int]:
    """``"8x512"`` -> ``(8, 512)``: two positive whole numbers joined by ``x``."""
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected ROWSxLENGTH such as 8x512, got {text!r}")
    return int(parts[0]), int(parts[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="untraced serves, best kept")
    parser.add_argument("--prefill", default="8x512", type=rows_by_length,
                        help="ROWSxLENGTH of the prefill profiled after the batches")  # fmt: skip
    args = parser.parse_args()
    bench = Bench("profile_decode", args.cpus, args.threads)
    at_peak = jnp_dot_peak(1e9)  # seconds a GFLOP takes at the peak
    peak = 1e9 / min(at_peak() for _ in range(3))
    results = {str(b): profile(bench, args, int(b), peak) for b in args.batches.split(",")}
    prefill = profile_prefill(bench, args, peak)
    bench.finish({"args": vars(args), "peak_flops": peak, "batches": results, "prefill": prefill})


if __name__ == "__main__":
    main()

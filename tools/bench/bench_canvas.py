"""Benchmark canvas generation against autoregressive decoding of the same length, in Dew.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_canvas.py [--rounds 5] [--cpus 0] [--threads 1]
        [--batch 8] [--prompt 32] [--length 64] [--steps 16,64] [--block 16]

One decoder (Qwen3-shaped: 4 layers, width 256, 4 heads, 2 KV heads, head_dim 64, vocab
4096, random weights) serves both sides: ``TextGeneration`` decodes ``--length`` new tokens
after a ``--prompt``-long prompt for ``--batch`` rows (greedy; the causal decoder with its
key/value cache), and ``CanvasGeneration`` fills a canvas of the same ``--length`` positions
after the same prompts in each of ``--steps`` model calls (LLaDA's low-confidence remasking,
greedy; every call reads the whole canvas, there is no cache of finished positions). Two
block-diffusion contenders fill the same canvas block-causally in blocks of ``--block``
positions (``block_causal=True``) with the same steps: "block canvas" with
``kv_cache=False`` (every step reads the whole canvas under the block-causal mask) and
"cached block canvas" with the default ``kv_cache=True`` (the prompt and each finished
block go once into a key/value cache, each step reads the current block only). The two
give the same tokens. Same prompts, same shapes, all compiled before the rounds.

Contenders run in the same interleaved rounds (tools/bench/_rounds.py), pinned to the same
CPUs with the same thread count; a round's value is the best of ``--repeats`` calls.
Printed: median and spread of each, generated tokens per second, and the ratio AR decode
time / canvas time for each step count (above 1: the canvas is faster), and the ratios
uncached / cached block canvas and AR decode / cached block canvas. A canvas with as
many steps as positions makes one model call per token, each over the whole row, so it
cannot beat a cached decoder; fewer steps trade quality for speed. Record:
tools/bench/results/canvas.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", default="16,64", help="canvas step counts, comma-separated")
    parser.add_argument("--block", type=int, default=16, help="block length of the block canvases")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    bench = Bench("canvas", args.cpus, args.threads)

    import jax
    import numpy as np

    from dew.inference import TextGeneration
    from dew.inference.canvas import Canvas, CanvasGeneration
    from dew.models import build
    from dew.sampling import Sampling

    vocab, mask = 4096, 4095
    model = build(
        "qwen3", vocab_size=vocab, max_seq_len=args.prompt + args.length, emb_features=256,
        num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64, mlp_features=1088,
    )  # fmt: skip
    variables = jax.device_get(model.init(jax.random.key(0), np.zeros((1, 8), np.int32)))
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, mask, args.prompt)) for _ in range(args.batch)]
    greedy = Sampling(temperature=0.0)
    decoder = TextGeneration(model, variables)
    canvases = {
        int(s): CanvasGeneration(
            model, variables, canvas=Canvas(mask_id=mask, real_tokens=mask, steps=int(s))
        )
        for s in args.steps.split(",")
    }
    blocks = {
        (int(s), cache): CanvasGeneration(
            model, variables,
            canvas=Canvas(
                mask_id=mask, real_tokens=mask, steps=int(s), block_length=args.block,
                block_causal=True, kv_cache=cache,
            ),
        )
        for s in args.steps.split(",")
        for cache in (False, True)
    }  # fmt: skip
    names = {False: "block canvas", True: "cached block canvas"}

    def timed(call):  # type: ignore[no-untyped-def]
        def run() -> list[float]:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            return [min(times)]

        return run

    contenders = {"ar decode": timed(lambda: decoder(prompts, args.length, 0, greedy))}
    for steps, generate in canvases.items():
        contenders[f"canvas {steps} steps"] = timed(
            lambda g=generate: g(prompts, args.length, 0, greedy)
        )
    for (steps, cache), generate in blocks.items():
        contenders[f"{names[cache]} {steps} steps"] = timed(
            lambda g=generate: g(prompts, args.length, 0, greedy)
        )
    same = {}  # the cache must not change the tokens: rows equal between the two paths
    for steps in canvases:
        plain, cached = (blocks[steps, c](prompts, args.length, 0, greedy) for c in (False, True))
        same[steps] = sum(np.array_equal(a.ids, b.ids) for a, b in zip(plain, cached))
        print(f"block canvas {steps} steps: {same[steps]}/{len(plain)} rows equal with the cache")
    for fn in contenders.values():  # compile and warm up outside the rounds
        fn()
    times = bench.rounds(contenders, args.rounds)
    tokens = args.batch * args.length
    for name, values in times.items():
        median = sorted(values)[len(values) // 2]
        bench.show(name, values, extra=f"{tokens / median:,.0f} generated tokens/s")
    for steps in canvases:
        bench.compare(
            f"ar decode / canvas {steps} steps (time)",
            times["ar decode"],
            times[f"canvas {steps} steps"],
        )
        for other in ("block canvas", "ar decode"):
            bench.compare(
                f"{other} / cached block canvas {steps} steps (time)",
                times[f"{other} {steps} steps" if other != "ar decode" else other],
                times[f"cached block canvas {steps} steps"],
            )
    settings = {"batch": args.batch, "prompt": args.prompt, "length": args.length}
    rows = {str(k): f"{v}/{args.batch}" for k, v in same.items()}
    bench.finish({**settings, "block": args.block, "rows_equal_cached_vs_uncached": rows})


if __name__ == "__main__":
    main()

"""Benchmark Dew's generation against transformers' greedy `generate` on the same weights.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_generation.py [--rounds 3] [--new-tokens 64]
        [--cpus 0] [--threads 1] [--shape small|qwen3-0.6b] [--dtype float32|bfloat16]

A reference worker (tools/reference_env.sh: torch CPU + transformers) writes a random Qwen3
checkpoint (``--shape small``: 5.2M parameters, 4 layers, width 256, 4 heads, 2 KV heads,
head_dim 64, vocab 4096; ``--shape qwen3-0.6b`` for a machine that holds it) and stays up,
serving greedy ``generate`` at batch 1, 8 and 32, a prefill forward at [8, 512] and a
one-token request. Dew loads the same checkpoint with ``dew.models.load_pretrained`` and
serves the same work with ``dew.inference.Server`` (1, 8 and 32 concurrent requests, same
prompts, same budget, greedy), its prefill at [8, 512] and a one-token request.

Every pair is a contender pair in the same interleaved rounds (tools/bench/_rounds.py), both
pinned to the same CPUs with the same thread count; a round's value is the best of
``--repeats`` calls. Printed: median and spread of each, ratios transformers / Dew of the
times (above 1: Dew faster) with the per-round spread and the verdict against the goals
(decode >= 2.5x at each batch, prefill >= 1.5x), and the programs compiled while generating
for 100 prompts of random lengths. The ``jnp.dot`` and torch matmul peaks (1024-square
float32) run in the same rounds, as the time each side's prefill FLOPs would take at its
own library's peak: Dew's and transformers' shares of them, and the prefill ceiling
(transformers' prefill time over the time Dew's prefill FLOPs take at the ``jnp.dot`` peak,
the ratio a Dew prefill at the peak would reach) are printed, and the same ceiling for each
decode batch. Each side is counted for the work it does: transformers' forward computes the
logits at every position, Dew's prefill only at each row's last token (``prefill_flops``).
With ``--peak-tflops`` (the card's datasheet rate), each side's prefill MFU too: its prefill
FLOPs / median time / peak (record: ``prefill_mfu``).
Record: tools/bench/results/generation.json.
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
    mfu,
    mfu_text,
    reference_python,
    spread,
)
from _shapes import SHAPES, add_model_arguments  # noqa: E402

PROMPT_LEN = 32
GOAL_DECODE, GOAL_PREFILL = 2.5, 1.5

REFERENCE = (
    WORKER_LOOP
    + r"""
import time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
threads = torch_threads(torch)
directory, prompt_len, cfg, dtype = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
device = sys.argv[5]
torch.manual_seed(0)
config = Qwen3Config(**cfg, max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0)
model = Qwen3ForCausalLM(config).float().eval()
model.save_pretrained(directory)
params = sum(p.numel() for p in model.parameters())
model = model.to(torch.bfloat16 if dtype == "bfloat16" else torch.float32).to(device)
import transformers
gen = torch.Generator().manual_seed(1)
V = cfg["vocab_size"]
prompts = {}
def generate(ids, n):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
def best(fn, repeats):
    walls = []
    for _ in range(repeats):
        sync(torch, device)
        w = time.perf_counter(); fn(); sync(torch, device); walls.append(time.perf_counter() - w)
    return {"s": min(walls)}
def decode(batch, new_tokens, repeats):
    if batch not in prompts:
        prompts[batch] = torch.randint(1, V, (batch, prompt_len), generator=gen).to(device)
        generate(prompts[batch], 4)
    return best(lambda: generate(prompts[batch], new_tokens), repeats)
long_ids = torch.randint(1, V, (8, 512), generator=gen).to(device)
def prefill(repeats):
    def forward():
        with torch.no_grad():
            model(long_ids, use_cache=True)
    return best(forward, repeats)
one = torch.randint(1, V, (1, prompt_len), generator=gen).to(device)
def ttft(repeats):
    return best(lambda: generate(one, 1), repeats)
generate(one, 4)
serve({"decode": decode, "prefill": prefill, "ttft": ttft,
       "peak": lambda reps: torch_matmul_peak(torch, reps, device)},
      {"params": params, "torch": torch.__version__, "threads": threads,
       "transformers": transformers.__version__,
       "device": torch.cuda.get_device_name() if device != "cpu" else "cpu"})
"""
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=2, help="best of N calls per round")
    add_model_arguments(parser)
    parser.add_argument("--no-compiles", action="store_true",
                        help="skip the 100-prompt compile count")  # fmt: skip
    args = parser.parse_args()
    bench = Bench("generation", args.cpus, args.threads, args.device)  # before jax starts

    import jax
    import jax.numpy as jnp
    import numpy as np

    from dew import models
    from dew.inference import Server
    from dew.sampling import Sampling

    batches = [int(b) for b in args.batches.split(",")]
    cfg = SHAPES[args.shape]
    vocab = cfg["vocab_size"]
    with tempfile.TemporaryDirectory() as directory:
        worker = Worker([reference_python(), "-c", REFERENCE, directory, str(PROMPT_LEN),
                         json.dumps(cfg), args.dtype, args.device])  # fmt: skip
        try:
            info = worker.info
            pre = models.load_pretrained(directory)
            model = pre.model
            if args.dtype == "bfloat16":
                model = models.build("qwen3", **{**pre.config.__dict__, "dtype": "bfloat16"})
            variables = pre.variables
            rng = np.random.default_rng(1)
            greedy = Sampling(temperature=0.0)
            capacity = PROMPT_LEN + args.new_tokens

            def best(fn) -> float:
                walls = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    fn()
                    walls.append(time.perf_counter() - start)
                return min(walls)

            def dew_decode(b: int):
                server = Server(model, variables, slots=b, capacity=capacity, sampling=greedy,
                                steps_per_call=args.steps_per_call)  # fmt: skip
                prompts = rng.integers(1, vocab, size=(b, PROMPT_LEN))

                def serve() -> None:
                    for p in prompts:
                        server.submit(p, args.new_tokens)
                    done = server.run()
                    assert sum(len(c.ids) for c in done.values()) == b * args.new_tokens

                serve()  # compile admission and decode
                return lambda: best(serve)

            prefill = jax.jit(lambda v, ids, n: model.apply(v, ids, n, 512, method="prefill"))
            long_ids = jnp.asarray(rng.integers(1, vocab, size=(8, 512)), jnp.int32)
            lengths = jnp.full((8,), 512, jnp.int32)

            def fill() -> None:
                jax.block_until_ready(prefill(variables, long_ids, lengths))

            fill()
            first = Server(model, variables, slots=8, capacity=capacity, sampling=greedy)

            def first_token() -> None:
                first.submit(rng.integers(1, vocab, size=PROMPT_LEN), 1)
                (done,) = first.step()
                assert len(done.ids) == 1

            first_token()
            contenders = {}
            for b in batches:
                contenders[f"transformers decode B={b}"] = (
                    lambda b=b: worker.ask(
                        op="decode", batch=b, new_tokens=args.new_tokens, repeats=args.repeats
                    )["s"]  # fmt: skip
                )
                contenders[f"dew decode B={b}"] = dew_decode(b)
            contenders["transformers prefill"] = lambda: worker.ask(op="prefill",
                                                                    repeats=args.repeats)["s"]  # fmt: skip
            contenders["dew prefill"] = lambda: best(fill)
            contenders["transformers ttft"] = lambda: worker.ask(op="ttft", repeats=args.repeats)[
                "s"
            ]
            contenders["dew ttft"] = lambda: best(first_token)
            flops = {"dew": prefill_flops(info["params"], cfg, 8, 512, head_tokens=8),
                     "transformers": prefill_flops(info["params"], cfg, 8, 512)}  # fmt: skip
            contenders["jnp.dot peak"] = jnp_dot_peak(flops["dew"], device=args.device)
            contenders["torch matmul peak"] = lambda: (
                flops["transformers"] / worker.ask(op="peak", reps=10)["flops_per_s"]
            )
            times = bench.rounds(contenders, args.rounds)
        finally:
            worker.close()
        compiles = {} if args.no_compiles else compile_counts(model, variables, rng, vocab)
    bench.say(
        f"model: Qwen3 '{args.shape}' {info['params'] / 1e6:.2f}M params, {args.dtype}; "
        f"transformers {info['transformers']} torch {info['torch']} ({info['threads']} threads); "
        f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}),"
        f" torch on {info.get('device', 'cpu')}; {args.rounds} rounds, best of "
        f"{args.repeats} per round; prompt {PROMPT_LEN}, {args.new_tokens} new tokens per "
        "request, prefill included; ratios are transformers / Dew time (above 1: Dew faster)"
    )
    for b in batches:
        tokens = b * args.new_tokens
        for side in ("transformers", "dew"):
            values = times[f"{side} decode B={b}"]
            bench.show(f"{side} decode B={b}", values,
                       extra=f"{tokens / sorted(values)[len(values) // 2]:8.0f} tok/s")  # fmt: skip
        bench.compare(f"decode B={b}", times[f"transformers decode B={b}"],
                      times[f"dew decode B={b}"], GOAL_DECODE)  # fmt: skip
    # With --peak-tflops, each side's prefill MFU: prefill FLOPs / median time / peak.
    prefill_s = {side: spread(times[f"{side} prefill"]).median for side in ("transformers", "dew")}
    for name, goal in (("prefill", GOAL_PREFILL), ("ttft", None)):
        for side in ("transformers", "dew"):
            extra = (
                mfu_text(flops[side], prefill_s[side], args.peak_tflops)
                if name == "prefill"
                else ""
            )
            bench.show(f"{side} {name}", times[f"{side} {name}"], extra=extra.strip())
        bench.compare(name, times[f"transformers {name}"], times[f"dew {name}"], goal)
    bench.say(
        "prefill [8, 512] against the matmul peaks measured in the same rounds (a peak's"
        f" value: the time a side's prefill FLOPs take at it; Dew {flops['dew'] / 1e9:.1f},"
        f" transformers {flops['transformers'] / 1e9:.1f} GFLOP, the head at the last token"
        " against every token):"
    )
    for name in ("jnp.dot peak", "torch matmul peak"):
        bench.show(name, times[name])
    bench.compare("dew prefill share of same-round jnp.dot peak", times["jnp.dot peak"],
                  times["dew prefill"])  # fmt: skip
    bench.compare("transformers prefill share of same-round torch matmul peak",
                  times["torch matmul peak"], times["transformers prefill"])  # fmt: skip
    # The highest transformers / Dew prefill ratio a Dew running at the jnp.dot peak reaches:
    # when it is below the goal, no Dew prefill on this machine can meet the goal.
    bench.compare("prefill ceiling (transformers / jnp.dot peak time)",
                  times["transformers prefill"], times["jnp.dot peak"], GOAL_PREFILL)  # fmt: skip
    # The same bound for decode: the requests' FLOPs (prompt and new tokens through the model,
    # attention over the growing cache) at the same round's jnp.dot peak. Skinny decode matmuls
    # run far below a square matmul's peak, so this ceiling is generous.
    whole = PROMPT_LEN + args.new_tokens
    for b in batches:
        scale = prefill_flops(info["params"], cfg, b, whole) / flops["dew"]
        at_peak = [value * scale for value in times["jnp.dot peak"]]
        bench.compare(f"decode B={b} ceiling (transformers / jnp.dot peak time)",
                      times[f"transformers decode B={b}"], at_peak, GOAL_DECODE)  # fmt: skip
    for name, c in compiles.items():
        bench.say(f"{name}: 100 prompts of random length 1..256, 16 new tokens: {c['compiles']} "
                  f"programs compiled in {c['compile_s']:.1f} s (wall {c['wall_s']:.1f} s)")  # fmt: skip
    bench.finish({"args": vars(args), "reference": info, "compiles": compiles,
                  "prefill_flops": flops,
                  "prefill_mfu": {side: mfu(flops[side], s, args.peak_tflops)
                                  for side, s in prefill_s.items()}})  # fmt: skip


def prefill_flops(params: int, cfg: dict, b: int, t: int, head_tokens: int | None = None) -> float:
    """Forward FLOPs of a prefill of ``b`` rows of ``t`` tokens: 2 x the layers' parameters x
    tokens, 2 x the tied head's (vocab x width: its matmul; the embedding lookup is free) x
    ``head_tokens`` (default every token, as transformers' forward; Dew's prefill runs the head
    on each row's last token, ``b``), and causal attention (scores and values, half the
    square)."""
    tokens = b * t
    head = cfg["vocab_size"] * cfg["hidden_size"]
    attention = 2 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * cfg["head_dim"]
    on = tokens if head_tokens is None else head_tokens
    return 2.0 * (params - head) * tokens + 2.0 * head * on + attention * t * tokens


def compile_counts(model, variables, rng, vocab: int) -> dict:  # type: ignore[no-untyped-def]
    """Programs compiled while serving 100 prompts of random lengths (TextGeneration, Server)."""
    import jax

    from dew.inference import Server, TextGeneration
    from dew.sampling import Sampling

    greedy = Sampling(temperature=0.0)
    lengths = rng.integers(1, 257, size=100)
    policy = TextGeneration(model, variables)
    start = time.perf_counter()
    for i, n in enumerate(lengths):
        policy(rng.integers(1, vocab, size=int(n)), 16, jax.random.key(i), greedy)
    out = {"textgen_100": {"compiles": policy.compile_count, "compile_s": policy.compile_seconds,
                           "wall_s": time.perf_counter() - start}}  # fmt: skip
    server = Server(model, variables, slots=8, capacity=256 + 16, sampling=greedy)
    start = time.perf_counter()
    for n in lengths:
        server.submit(rng.integers(1, vocab, size=int(n)), 16)
    server.run()
    out["server_100"] = {"compiles": server.compile_count, "compile_s": server.compile_seconds,
                         "wall_s": time.perf_counter() - start}  # fmt: skip
    return out


if __name__ == "__main__":
    main()

"""Benchmark Dew's generation against transformers' greedy `generate` on the same weights.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_generation.py [--new-tokens 64] [--quick]

It asks the reference interpreter (tools/reference_env.sh: torch CPU +
transformers) to write a random 5.2M-parameter Qwen3 checkpoint (4 layers,
width 256, 4 heads, 2 KV heads, head_dim 64, vocab 4096, float32) and to time,
on it, greedy `generate` at batch 1, 8 and 32, a prefill forward at [8, 512]
and the time to a first token. Then it loads the same checkpoint with
`dew.models.load_pretrained`, times `dew.inference.Server` with 1, 8 and 32
concurrent requests (same prompts, same budget, greedy), Dew's prefill at
[8, 512] and a one-token request, counts the programs compiled while
generating for 100 prompts of random lengths, and prints every ratio
(Dew / transformers; above 1 means Dew is faster).
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
PROMPT_LEN = 32

REFERENCE = r"""
import json, sys, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
directory, new_tokens, prompt_len, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
threads, repeats = int(sys.argv[5]), int(sys.argv[6])
if threads > 0:
    torch.set_num_threads(threads)
torch.manual_seed(0)
config = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=1088, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
    tie_word_embeddings=True, rope_theta=10000.0)
model = Qwen3ForCausalLM(config).float().eval()
model.save_pretrained(directory)
params = sum(p.numel() for p in model.parameters())
import transformers
out = {"params": params, "torch": torch.__version__, "threads": torch.get_num_threads(),
       "transformers": transformers.__version__}
gen = torch.Generator().manual_seed(1)
def prompts(b):
    return torch.randint(1, 4096, (b, prompt_len), generator=gen)
def generate(ids, n):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
def best(fn):
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w); cpus.append(time.process_time() - c)
    return [min(walls), min(cpus)]
generate(prompts(1), 4)
decode = {}
for b in batches:
    ids = prompts(b)
    generate(ids, 4)
    decode[b] = best(lambda: generate(ids, new_tokens)) + [b * new_tokens]
out["decode"] = decode
ids = torch.randint(1, 4096, (8, 512), generator=gen)
def forward():
    with torch.no_grad():
        model(ids, use_cache=True)
forward()
out["prefill"] = best(forward) + [8 * 512]
one = prompts(1)
out["ttft"] = best(lambda: generate(one, 1)) + [1]
print("RESULT" + json.dumps(out))
"""


def reference_python() -> str:
    script = ROOT / "tools" / "reference_env.sh"
    done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def run_reference(
    directory: str, new_tokens: int, batches: list[int], threads: int, repeats: int
) -> dict:
    argv = [directory, str(new_tokens), str(PROMPT_LEN), json.dumps(batches), str(threads)]
    done = subprocess.run(
        [reference_python(), "-c", REFERENCE, *argv, str(repeats)],
        check=True,
        capture_output=True,
        text=True,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT")][-1]
    result = json.loads(line[len("RESULT") :])
    result["decode"] = {int(k): v for k, v in result["decode"].items()}
    return result


def best(fn, repeats: int) -> list[float]:
    """[best wall seconds, best CPU seconds of this process] over `repeats` runs."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return [min(walls), min(cpus)]


def run_dew(
    directory: str, new_tokens: int, batches: list[int], steps_per_call: int, repeats: int
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dew.inference import Server, TextGeneration
    from dew.models import load_pretrained
    from dew.sampling import Sampling

    pretrained = load_pretrained(directory)
    rng = np.random.default_rng(1)
    out: dict = {"jax": jax.__version__}
    greedy = Sampling(temperature=0.0)
    capacity = PROMPT_LEN + new_tokens
    decode = {}
    for b in batches:
        server = Server(
            pretrained.model,
            pretrained.variables,
            slots=b,
            capacity=capacity,
            sampling=greedy,
            steps_per_call=steps_per_call,
        )
        prompts = rng.integers(1, 4096, size=(b, PROMPT_LEN))

        def serve(server=server, prompts=prompts) -> None:
            for p in prompts:
                server.submit(p, new_tokens)
            done = server.run()
            assert sum(len(c.ids) for c in done.values()) == len(prompts) * new_tokens

        serve()  # compile admission and decode
        decode[b] = best(serve, repeats) + [b * new_tokens]
    out["decode"] = decode
    model = pretrained.model
    prefill = jax.jit(lambda v, ids, n: model.apply(v, ids, n, 512, method="prefill"))
    ids = jnp.asarray(rng.integers(1, 4096, size=(8, 512)), jnp.int32)
    lengths = jnp.full((8,), 512, jnp.int32)

    def fill() -> None:
        jax.block_until_ready(prefill(pretrained.variables, ids, lengths))

    fill()
    out["prefill"] = best(fill, repeats) + [8 * 512]
    server = Server(
        pretrained.model, pretrained.variables, slots=8, capacity=capacity, sampling=greedy
    )

    def first_token() -> None:
        server.submit(rng.integers(1, 4096, size=PROMPT_LEN), 1)
        (done,) = server.step()
        assert len(done.ids) == 1

    first_token()
    out["ttft"] = best(first_token, repeats) + [1]
    lengths_100 = rng.integers(1, 257, size=100)
    policy = TextGeneration(pretrained.model, pretrained.variables)
    start = time.perf_counter()
    for i, n in enumerate(lengths_100):
        policy(rng.integers(1, 4096, size=int(n)), 16, jax.random.key(i), greedy)
    out["textgen_100"] = {
        "compiles": policy.compile_count,
        "compile_s": policy.compile_seconds,
        "wall_s": time.perf_counter() - start,
    }
    server = Server(
        pretrained.model, pretrained.variables, slots=8, capacity=256 + 16, sampling=greedy
    )
    start = time.perf_counter()
    for n in lengths_100:
        server.submit(rng.integers(1, 4096, size=int(n)), 16)
    server.run()
    out["server_100"] = {
        "compiles": server.compile_count,
        "compile_s": server.compile_seconds,
        "wall_s": time.perf_counter() - start,
    }
    return out


def _line(label: str, ref: list[float], dew: list[float], unit: str = "tok/s") -> str:
    """Throughput by wall clock and by process CPU time, with Dew/transformers ratios."""
    n = ref[2]
    rw, rc, dw, dc = n / ref[0], n / ref[1], n / dew[0], n / dew[1]
    return (
        f"  {label:<22} wall: transformers {rw:8.0f} dew {dw:8.0f} {unit} ratio {dw / rw:5.2f}x"
        f" | cpu-time: transformers {rc:8.0f} dew {dc:8.0f} ratio {dc / rc:5.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3, help="best of N for every timing")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads for both peers (torch.set_num_threads and XLA's intra-op pool); "
        "0 keeps each library's default",
    )
    parser.add_argument(
        "--cpus",
        type=int,
        default=0,
        help="pin both peers (this process and the reference subprocess) to the first N "
        "CPUs; 0 leaves the affinity alone",
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.cpus > 0:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    elif args.threads > 1:
        flag = f"intra_op_parallelism_threads={args.threads}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_reference(tmp, args.new_tokens, batches, args.threads, args.repeats)
        dew = run_dew(tmp, args.new_tokens, batches, args.steps_per_call, args.repeats)
    print(
        f"model: Qwen3 shape, {ref['params'] / 1e6:.2f}M params, float32; transformers "
        f"{ref['transformers']} torch {ref['torch']} ({ref['threads']} threads); jax {dew['jax']}"
        f"; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; pinned to CPUs "
        f"{sorted(os.sched_getaffinity(0))}; best of {args.repeats}"
    )
    print(
        f"greedy decode (Server vs generate), prompt {PROMPT_LEN}, {args.new_tokens} new "
        "tokens per request, prefill included; ratios are Dew / transformers"
    )
    for b in batches:
        print(_line(f"{b} concurrent", ref["decode"][b], dew["decode"][b]))
    print(_line("prefill [8, 512]", ref["prefill"], dew["prefill"]))
    r, d = ref["ttft"], dew["ttft"]
    print(
        f"  time to first token    wall: transformers {r[0] * 1e3:.1f} ms dew {d[0] * 1e3:.1f} ms"
        f" ratio {r[0] / d[0]:5.2f}x | cpu-time: transformers {r[1] * 1e3:.1f} ms "
        f"dew {d[1] * 1e3:.1f} ms ratio {r[1] / d[1]:5.2f}x"
    )
    for name in ("textgen_100", "server_100"):
        c = dew[name]
        print(
            f"{name}: 100 prompts of random length 1..256, 16 new tokens: {c['compiles']} "
            f"programs compiled in {c['compile_s']:.1f} s (wall {c['wall_s']:.1f} s)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

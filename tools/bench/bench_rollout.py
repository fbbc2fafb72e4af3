"""Benchmark dew-rollout: NativeRolloutServer against a real vLLM CPU engine, and the
cost of a SafetensorsReload push.

Run from the repository root with the workspace interpreter, after building the engine's
virtualenv with tools/vllm_engine.sh:

    DEW_VLLM_ENV=tools/.envs/vllm .venv/bin/python tools/bench/bench_rollout.py --cpus 0 --threads 1
        [--rounds 3] [--skip-push] [--only throughput|publication|adapter-push]

Part 1, throughput. The tiny untied Qwen3 of dew-rollout's tests (2 layers, width 128,
head_dim 64, vocab 384) is written once with `SafetensorsReload.write` (bfloat16); vLLM
serves it in float32 (`--dtype float32`), and `NativeRolloutServer` serves the same file
(`load_pretrained`, float32) on a `Server` with 32 slots. Both draw 64 new tokens per
request at temperature one with no EOS, for the same prompts and seeds, at 1, 8 and 32
concurrent requests (each level submits 2x that many requests, at most that many in
flight). Seconds per draw are timed per round; contenders rotate order in each of the
interleaved rounds. The ratio is native / vLLM (above one:
native faster); the goal is native within 2x of vLLM, i.e. a ratio >= 0.5.

Part 2, publication. A ~100M-parameter Qwen3 tree is pushed with `SafetensorsReload`
(bfloat16 write, staging, os.replace, then vLLM's pause / reload_weights / reset /
version / resume on a real engine serving that checkpoint) and, in the same rounds, the
same tensors are written with `safetensors.numpy.save_file` alone.

Part 3, adapter push. One engine serves the same ~100M checkpoint with run-time LoRA on
(`lora_rank=16`: `--enable-lora --max-lora-rank 16 --max-loras 2`). In the same rounds it
takes a full push (`SafetensorsReload`, as in Part 2) and an `AdapterReload` push of a
rank-16 adapter on q, k, v, o, gate, up and down whose `b` factors are drawn afresh before
each push (outside the timed call), so every push loads a new adapter under a new name.
One push of each runs before the rounds. Printed: both push times, the bytes each push
writes (the bfloat16 checkpoint, the float32 adapter), and full / adapter push time (goal
above 1). `--only adapter-push` runs this part alone and writes its record to
tools/bench/results/adapter_push.json, so rollout.json keeps the other parts' numbers
(`--only` of another part writes rollout_<part>.json).

The rounds come from tools/bench/_rounds.py (order rotating); the engine is started under
`taskset` on the CPUs the bench is pinned to, so both sides run on the same CPUs. Use one CPU
(`--cpus 0 --threads 1`): on two, vLLM's OpenMP pool and its polling engine core starve each
other. The machine is shared (on the project's 2-core machine, by several agents at once),
so every number comes with its spread (min-max over rounds) and the machine record is
written to tools/bench/results/rollout.json: CPU model, flags, core count, load average
before and after. A ratio whose per-round spread crosses the goal is reported "not shown".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packages" / "dew-rollout" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import httpx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _rounds import Bench, add_arguments  # noqa: E402
from rollout_engine import (  # noqa: E402
    SERVED_NAME,
    TINY,
    VLLMEngine,
    tiny_pretrained,
    vllm_python,
)
from safetensors.numpy import save_file  # noqa: E402

from dew import models  # noqa: E402
from dew.inference import Server  # noqa: E402
from dew.models import Pretrained, load_pretrained  # noqa: E402
from dew.models.lora import PROJECTIONS, LoraConfig, init_adapters  # noqa: E402
from dew.rollout import (  # noqa: E402
    AdapterReload,
    NativeRolloutServer,
    OpenAICompletion,
    OpenAIRolloutServer,
    SafetensorsReload,
)
from dew.sampling import Sampling  # noqa: E402

LEVELS = (1, 8, 32)
NEW_TOKENS = 64
PROMPT_LEN = 16
GOAL = 0.5  # native / vLLM draws per second
ADAPTER_GOAL = 1.0  # full push time / adapter push time
LORA = LoraConfig(rank=16, alpha=32, targets=PROJECTIONS)
PARTS = ("throughput", "publication", "adapter-push")
# max_seq_len matches the engine's --max-model-len 4096 (vLLM refuses a longer one).
BIG = dict(TINY, vocab_size=32000, emb_features=640, num_layers=10, num_heads=10,
           num_kv_heads=5, mlp_features=2560, max_seq_len=4096)  # fmt: skip


def bench_cpus() -> list[int]:
    """The CPUs the bench process is pinned to (``--cpus``), for the engine's ``taskset``.

    vLLM's CPU worker sizes its OpenMP pool from the CPUs it sees, and its engine core polls
    the worker on one of them: unpinned on two cores the pool's threads kept waiting on
    each other and one 64-token draw took 11 s (about 1.7 ms a token pinned to one CPU).
    Pinning the engine to the same CPUs as the native side keeps the comparison even."""
    return sorted(os.sched_getaffinity(0))


def run_level(server, prompts: list[list[int]], concurrency: int) -> tuple[float, int]:
    """Submit every prompt with at most `concurrency` in flight; (seconds, new tokens)."""
    gate = threading.Semaphore(concurrency)
    futures = []
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        gate.acquire()
        future = server.submit(prompt, NEW_TOKENS, seed=i)
        future.add_done_callback(lambda _: gate.release())
        futures.append(future)
    tokens = sum(int(f.result(timeout=600).ids.shape[0]) for f in futures)
    return time.perf_counter() - start, tokens


def throughput(bench: Bench, rounds: int, python: Path, work: Path) -> None:
    policy = tiny_pretrained()
    directory = work / "tiny"
    SafetensorsReload(policy, directory, ["http://127.0.0.1:1"]).write()
    served = load_pretrained(directory)
    engine = VLLMEngine(python, directory, work / "vllm-tiny", cpus=bench_cpus())
    client = httpx.Client(base_url=engine.url, timeout=600)
    remote = OpenAIRolloutServer(
        OpenAICompletion(SERVED_NAME, client), Sampling(), processed_logprobs=True, concurrency=64
    )
    native = NativeRolloutServer(
        Server(served.model, served.variables, slots=32, capacity=128, sampling=Sampling())
    )
    rng = np.random.default_rng(0)
    prompts = {c: [rng.integers(1, 128, PROMPT_LEN).tolist() for _ in range(2 * c)] for c in LEVELS}
    contenders = {"native": native, "vllm": remote}
    try:
        for c in LEVELS:  # warm-up: compiles and caches out of the timed rounds
            for server in contenders.values():
                run_level(server, prompts[c], c)
        calls = {}
        for c in LEVELS:
            for name, server in contenders.items():
                calls[f"{name} c={c}"] = lambda server=server, c=c: (
                    run_level(server, prompts[c], c)[0] / len(prompts[c])
                )
        times = bench.rounds(calls, rounds)
    finally:
        native.close()
        remote.close()
        client.close()
        startup = engine.startup_seconds
        engine.close()
    bench.say(f"throughput: {NEW_TOKENS} new tokens per draw, prompt {PROMPT_LEN}, 2 x c draws "
              f"per level, at most c in flight; vLLM engine startup {startup:.1f} s; seconds per "
              "draw (the ratio is vLLM time / native time = native / vLLM draws per second)")  # fmt: skip
    for c in LEVELS:
        for name in contenders:
            values = times[f"{name} c={c}"]
            bench.show(f"{name} c={c}", values,
                       extra=f"{1 / sorted(values)[len(values) // 2]:.2f} draws/s")  # fmt: skip
        bench.compare(f"c={c} native / vLLM", times[f"vllm c={c}"], times[f"native c={c}"], GOAL)


def big_policy() -> Pretrained:
    model = models.build("qwen3", **BIG)
    variables = jax.jit(model.init)(jax.random.key(0), np.zeros((1, 4), np.int32))
    return Pretrained.from_model(model, jax.tree.map(np.asarray, variables))


def publication(bench: Bench, rounds: int, python: Path | None, work: Path) -> None:
    policy = big_policy()
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(policy.variables))
    directory = work / "big"
    reload = SafetensorsReload(policy, directory, ["http://127.0.0.1:1"], timeout=600)
    reload.write()
    engine = None
    if python is not None:
        engine = VLLMEngine(python, directory, work / "vllm-big", cpus=bench_cpus())
        reload = SafetensorsReload(policy, directory, [engine.url], timeout=600)
    variants = [policy.variables, tiny_variant(policy.variables)]
    version = iter(range(1, 10**6))

    def push() -> float:
        number = next(version)
        start = time.perf_counter()
        if engine is not None:
            reload(variants[number % 2], number)
        else:
            reload.write(variants[number % 2])
        return time.perf_counter() - start

    def alone() -> float:
        start = time.perf_counter()
        tensors = dict(policy.replace(variables=variants[0]).export("bfloat16"))
        save_file(tensors, str(work / "alone.safetensors"))
        return time.perf_counter() - start

    try:
        times = bench.rounds({"push": push, "alone": alone}, rounds, group="publication")
    finally:
        if engine is not None:
            engine.close()
    bench.say(f"publication: {count / 1e6:.1f}M parameters, bfloat16; SafetensorsReload push "
              f"{'on a real engine' if engine is not None else '(write only)'} vs safetensors "
              "save_file alone")  # fmt: skip
    bench.show("SafetensorsReload push", times["push"], 1.0, " s", 2)
    bench.show("safetensors alone", times["alone"], 1.0, " s", 2)
    bench.compare("push / alone time", times["push"], times["alone"])


def tiny_variant(variables):
    return jax.tree.map(lambda x: np.asarray(x) * np.float32(0.5), variables)


def fresh_adapters(base: dict, rng: np.random.Generator, scale: float = 0.02) -> dict:
    """`base` (an adapter tree) with every `b` factor redrawn as N(0, scale^2), so that
    each push carries a new, non-zero adapter; the `a` factors are kept."""
    return {
        key: (rng.normal(0.0, scale, value.shape).astype(np.float32) if key == "b" else value)
        if not isinstance(value, dict)
        else fresh_adapters(value, rng, scale)
        for key, value in base.items()
    }


def tree_bytes(path: Path) -> int:
    """Bytes of every file under `path` (a checkpoint or adapter directory)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def adapter_push(bench: Bench, rounds: int, python: Path, work: Path) -> dict:
    policy = big_policy()
    directory = work / "big-lora"
    full = SafetensorsReload(policy, directory, ["http://127.0.0.1:1"], timeout=600)
    full.write()
    engine = VLLMEngine(python, directory, work / "vllm-lora", cpus=bench_cpus(),
                        lora_rank=LORA.rank)  # fmt: skip
    full = SafetensorsReload(policy, directory, [engine.url], timeout=600)
    adapter = AdapterReload(policy.model.config, LORA, work / "adapters", [engine.url],
                            SERVED_NAME, timeout=600)  # fmt: skip
    base = jax.tree.map(np.asarray, init_adapters(jax.random.key(1), policy.model.config, LORA))
    rng = np.random.default_rng(0)
    variants = [policy.variables, tiny_variant(policy.variables)]
    version = iter(range(1, 10**6))

    def full_push() -> float:
        number = next(version)
        start = time.perf_counter()
        full(variants[number % 2], number)
        return time.perf_counter() - start

    def lora_push() -> float:
        tree = fresh_adapters(base, rng)
        start = time.perf_counter()
        adapter(tree, next(version))
        return time.perf_counter() - start

    try:
        warm = full_push(), lora_push()  # first pushes, out of the timed rounds
        times = bench.rounds({"full": full_push, "adapter": lora_push}, rounds, group="adapter")
        sizes = {
            "full": tree_bytes(directory),
            "adapter": tree_bytes(work / "adapters" / adapter.served_name),
        }
    finally:
        adapter.close()
        startup = engine.startup_seconds
        engine.close()
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(policy.variables))
    lora_count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(base))
    bench.say(f"adapter push: {count / 1e6:.1f}M-parameter base on one vLLM engine with LoRA on "
              f"(rank {LORA.rank}, {', '.join(LORA.targets)}; {lora_count / 1e6:.2f}M adapter "
              f"parameters); engine startup {startup:.1f} s; warm-up pushes full "
              f"{warm[0]:.2f} s, adapter {warm[1]:.2f} s")  # fmt: skip
    bench.say(f"  bytes written per push: full {sizes['full'] / 2**20:.1f} MiB (bfloat16), "
              f"adapter {sizes['adapter'] / 2**20:.2f} MiB (float32), "
              f"{sizes['full'] / sizes['adapter']:.1f}x")  # fmt: skip
    bench.show("full push (SafetensorsReload)", times["full"], 1.0, " s", 2)
    bench.show("adapter push (AdapterReload)", times["adapter"], 1.0, " s", 3)
    bench.compare("full / adapter push time", times["full"], times["adapter"], ADAPTER_GOAL)
    return {"push_bytes": sizes}


def record_name(only: str | None) -> str:
    """The record's name: rollout.json for a full run, another per part run alone."""
    if only is None:
        return "rollout"
    return "adapter_push" if only == "adapter-push" else f"rollout_{only}"


def main() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, rounds=3)
    parser.add_argument("--skip-push", action="store_true", help="skip parts 2 and 3")
    parser.add_argument("--only", choices=PARTS, help="run this part alone")
    args = parser.parse_args()
    bench = Bench(record_name(args.only), args.cpus, args.threads)
    python, reason = vllm_python()
    if python is None:
        sys.exit(f"bench_rollout: {reason}")
    parts = [args.only] if args.only else list(PARTS[:1] if args.skip_push else PARTS)
    steps = {"throughput": throughput, "publication": publication, "adapter-push": adapter_push}
    extra = {}
    with tempfile.TemporaryDirectory() as work:
        for part in parts:
            extra.update(steps[part](bench, args.rounds, python, Path(work)) or {})
    bench.finish({"new_tokens": NEW_TOKENS, "prompt_len": PROMPT_LEN, "goal": GOAL,
                  "adapter_goal": ADAPTER_GOAL, "lora_rank": LORA.rank, "parts": parts, **extra})  # fmt: skip


if __name__ == "__main__":
    main()

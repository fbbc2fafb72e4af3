"""Benchmark dew-rollout: NativeRolloutServer against a real vLLM CPU engine, and the
cost of a SafetensorsReload push.

Run from the repository root with the workspace interpreter, after building the engine's
virtualenv with tools/vllm_engine.sh:

    DEW_VLLM_ENV=tools/.envs/vllm .venv/bin/python tools/bench/bench_rollout.py [--rounds 3]

Part 1, throughput. The tiny untied Qwen3 of dew-rollout's tests (2 layers, width 128,
head_dim 64, vocab 128) is written once with `SafetensorsReload.write` (bfloat16); vLLM
serves it in float32 (`--dtype float32`), and `NativeRolloutServer` serves the same file
(`load_pretrained`, float32) on a `Server` with 32 slots. Both draw 64 new tokens per
request at temperature one with no EOS, for the same prompts and seeds, at 1, 8 and 32
concurrent requests (each level submits 2x that many requests, at most that many in
flight). Draws per second and new tokens per second are timed per round; contenders
alternate order in each of the interleaved rounds. The ratio is native / vLLM (above one:
native faster); the goal is native within 2x of vLLM, i.e. a ratio >= 0.5.

Part 2, publication. A ~100M-parameter Qwen3 tree is pushed with `SafetensorsReload`
(bfloat16 write, staging, os.replace, then vLLM's pause / reload_weights / reset /
version / resume on a real engine serving that checkpoint) and, in the same rounds, the
same tensors are written with `safetensors.numpy.save_file` alone.

The machine is shared (on the project's 2-core machine, by several agents at once), so
every number comes with its spread (min-max over rounds) and the machine record is
written to JSON (--out, default bench_rollout.json): CPU model, flags, core count, load
average before and after. A ratio whose spread crosses the goal is reported "not shown".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packages" / "dew-rollout" / "tests"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import httpx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
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
from dew.rollout import (  # noqa: E402
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
BIG = dict(TINY, vocab_size=32000, emb_features=640, num_layers=10, num_heads=10,
           num_kv_heads=5, mlp_features=2560, max_seq_len=1024)  # fmt: skip


def machine() -> dict:
    info = {"cpu_model": platform.processor() or "", "cores": os.cpu_count(), "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and not info["cpu_model"]:
                info["cpu_model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
                info["flags"] = sorted(flags & set(wanted))
                break
    except OSError:
        pass
    return info


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


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}  # fmt: skip


def throughput(rounds: int, python: Path, work: Path) -> dict:
    policy = tiny_pretrained()
    directory = work / "tiny"
    SafetensorsReload(policy, directory, ["http://127.0.0.1:1"]).write()
    served = load_pretrained(directory)
    engine = VLLMEngine(python, directory, work / "vllm-tiny.log")
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
        results: dict = {
            name: {c: {"draws": [], "tokens": []} for c in LEVELS} for name in contenders
        }
        for r in range(rounds):
            order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
            for c in LEVELS:
                for name in order:
                    seconds, tokens = run_level(contenders[name], prompts[c], c)
                    results[name][c]["draws"].append(len(prompts[c]) / seconds)
                    results[name][c]["tokens"].append(tokens / seconds)
                    print(f"round {r} c={c:>2} {name:>6}: {len(prompts[c]) / seconds:7.2f} draws/s "
                          f"{tokens / seconds:8.1f} tokens/s", flush=True)  # fmt: skip
    finally:
        native.close()
        remote.close()
        client.close()
        startup = engine.startup_seconds
        engine.close()
    report: dict = {"engine_startup_s": startup, "levels": {}}
    for c in LEVELS:
        n, v = results["native"][c], results["vllm"][c]
        ratios = [a / b for a, b in zip(n["draws"], v["draws"])]
        ratio = statistics.median(n["draws"]) / statistics.median(v["draws"])
        shown = min(ratios) >= GOAL or max(ratios) < GOAL
        report["levels"][c] = {
            "native_draws_per_s": summary(n["draws"]), "vllm_draws_per_s": summary(v["draws"]),
            "native_tokens_per_s": summary(n["tokens"]), "vllm_tokens_per_s": summary(v["tokens"]),
            "ratio_of_medians": ratio, "ratio_per_round": ratios,
            "goal_met": (ratio >= GOAL) if shown else "not shown",
        }  # fmt: skip
    return report


def big_policy() -> Pretrained:
    model = models.build("qwen3", **BIG)
    variables = jax.jit(model.init)(jax.random.key(0), np.zeros((1, 4), np.int32))
    return Pretrained.from_model(model, jax.tree.map(np.asarray, variables))


def publication(rounds: int, python: Path | None, work: Path) -> dict:
    policy = big_policy()
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(policy.variables))
    directory = work / "big"
    reload = SafetensorsReload(policy, directory, ["http://127.0.0.1:1"], timeout=600)
    reload.write()
    engine = None
    if python is not None:
        engine = VLLMEngine(python, directory, work / "vllm-big.log")
        reload = SafetensorsReload(policy, directory, [engine.url], timeout=600)
    variants = [policy.variables, tiny_variant(policy.variables)]
    push, alone = [], []
    try:
        for r in range(rounds):
            variables = variants[r % 2]
            for name in ("push", "alone") if r % 2 == 0 else ("alone", "push"):
                start = time.perf_counter()
                if name == "push":
                    if engine is not None:
                        reload(variables, r + 1)
                    else:
                        reload.write(variables)
                    push.append(time.perf_counter() - start)
                else:
                    tensors = dict(policy.replace(variables=variables).export("bfloat16"))
                    save_file(tensors, str(work / "alone.safetensors"))
                    alone.append(time.perf_counter() - start)
                print(f"round {r} {name:>5}: {(push if name == 'push' else alone)[-1]:.2f} s",
                      flush=True)  # fmt: skip
    finally:
        if engine is not None:
            engine.close()
    return {
        "parameters": count, "bytes_bf16": 2 * count, "reload_on_real_engine": engine is not None,
        "safetensors_reload_push_s": summary(push), "safetensors_alone_s": summary(alone),
        "ratio_of_medians": statistics.median(push) / statistics.median(alone),
    }  # fmt: skip


def tiny_variant(variables):
    return jax.tree.map(lambda x: np.asarray(x) * np.float32(0.5), variables)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench_rollout.json")
    parser.add_argument("--skip-push", action="store_true")
    args = parser.parse_args()
    python, reason = vllm_python()
    if python is None:
        sys.exit(f"bench_rollout: {reason}")
    record: dict = {"machine": machine(), "load_before": os.getloadavg(), "rounds": args.rounds,
                    "new_tokens": NEW_TOKENS, "prompt_len": PROMPT_LEN,
                    "note": "shared machine: other agents' processes run alongside"}  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        record["throughput"] = throughput(args.rounds, python, Path(work))
        for c, level in record["throughput"]["levels"].items():
            n, v = level["native_draws_per_s"], level["vllm_draws_per_s"]
            print(f"c={c:>2}: native {n['median']:.2f} [{n['min']:.2f}-{n['max']:.2f}] draws/s, "
                  f"vLLM {v['median']:.2f} [{v['min']:.2f}-{v['max']:.2f}] draws/s, "
                  f"ratio {level['ratio_of_medians']:.2f} (goal >= {GOAL}: {level['goal_met']})")  # fmt: skip
            nt, vt = level["native_tokens_per_s"], level["vllm_tokens_per_s"]
            print(f"      native {nt['median']:.0f} [{nt['min']:.0f}-{nt['max']:.0f}] tokens/s, "
                  f"vLLM {vt['median']:.0f} [{vt['min']:.0f}-{vt['max']:.0f}] tokens/s")  # fmt: skip
        if not args.skip_push:
            record["publication"] = publication(args.rounds, python, Path(work))
            pub = record["publication"]
            p, a = pub["safetensors_reload_push_s"], pub["safetensors_alone_s"]
            print(f"{pub['parameters'] / 1e6:.1f}M parameters: SafetensorsReload push "
                  f"{p['median']:.2f} s [{p['min']:.2f}-{p['max']:.2f}], safetensors alone "
                  f"{a['median']:.2f} s [{a['min']:.2f}-{a['max']:.2f}], "
                  f"ratio {pub['ratio_of_medians']:.2f}")  # fmt: skip
    record["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(record, indent=2))
    print(f"machine record: {args.out}")


if __name__ == "__main__":
    main()

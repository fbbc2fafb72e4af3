"""Time to the first step of ``dew train lm`` without, and then with, the persistent
compilation cache (``dew.compile_cache``).

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_first_step.py [--rounds 3] [--cpus 0,1] [--threads 2]
        [--device cpu|cuda] [--model-args "--emb-features 1024 ..."] [--contenders warm,...]

Each contender is a fresh ``dew train lm --steps 1`` process (a random token file, the
default ``qwen3`` shape: width 256, 4 layers, 4 heads; ``--seq-len`` and ``--batch``), in
interleaved rounds (tools/bench/_rounds.py):

* ``cold``: an empty cache directory of its own, so the run compiles everything and fills it;
* ``warm``: a cache directory filled once before the rounds, so every program is a hit;
* ``off``: ``--no-compile-cache``;
* ``cold scan``: as ``cold`` with ``--scan-layers`` (``dew.models.scan``: one compiled layer
  body looped over instead of one copy per layer);
* ``warm scan``: as ``warm`` with ``--scan-layers`` (its own cache, filled before the rounds).

``--contenders`` picks some of them; ``--device cuda`` runs JAX on its cuda platform and
``--model-args`` passes model flags to every run (``--pretrained DIR`` for a checkpoint's shape).

Printed per contender: the first step (from the start of ``fit`` to the first logged step:
state init, compile and one update; read from ``metrics.jsonl`` as the step's tokens over
its ``tokens_per_s``) and the whole process (interpreter start to exit), median and spread;
the whole process's compile phases summed over its programs (JAX's own durations: tracing,
lowering, the backend's compile or cache load) and the programs whose backend compile took
longest, so a cold first step shows how much of it is XLA compiling and on what; the ratios
cold / warm and cold scan / cold; the cache hits and entries of each run. Record:
tools/bench/results/first_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments, add_device_argument  # noqa: E402

#: The child: ``dew.cli.main`` with JAX's cache events counted and its compile phases summed
#: (JAX's monitoring durations: tracing to a jaxpr, lowering to MLIR, and the backend's
#: compile, which includes loading an executable from the persistent cache on a hit).
CHILD = """
import json, sys
from jax import monitoring
counts, seconds, programs = {}, {}, {}
BACKEND = "/jax/core/compile/backend_compile_duration"
def timed(name, secs, fun_name="", **kw):
    seconds[name] = seconds.get(name, 0.0) + secs
    if name == BACKEND:
        programs[fun_name] = programs.get(fun_name, 0.0) + secs
monitoring.register_event_listener(
    lambda name, **kw: counts.__setitem__(name, counts.get(name, 0) + 1))
monitoring.register_event_duration_secs_listener(timed)
from dew.cli import main
status = main(sys.argv[1:])
print("RESULT " + json.dumps({"status": status,
      "hits": counts.get("/jax/compilation_cache/cache_hits", 0),
      "misses": counts.get("/jax/compilation_cache/cache_misses", 0), "programs": programs,
      **{phase: seconds.get("/jax/core/compile/" + event, 0.0) for phase, event in
         (("trace", "jaxpr_trace_duration"), ("lower", "jaxpr_to_mlir_module_duration"),
          ("backend compile", "backend_compile_duration"))}}))
"""
PHASES = ("trace", "lower", "backend compile")


def one_run(
    work: Path, name: str, cache: Path | None, args: argparse.Namespace, extra: tuple = ()
) -> dict:
    """One fresh ``dew train lm`` process (``extra`` flags added); its first-step and
    whole-process seconds."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{name.replace(' ', '-')}-", dir=work))
    flags = ["--no-compile-cache"] if cache is None else ["--compile-cache-dir", str(cache)]
    flags += list(extra)
    command = [sys.executable, "-c", CHILD, "train", "lm", "--tokens", str(work / "tokens.npy"),
               "--run-dir", str(run_dir / "run"), "--steps", "1", "--batch", str(args.batch),
               "--seq-len", str(args.seq_len), "--log-every", "1", "--compile-cache", *flags]  # fmt: skip
    command += args.model_args.split()
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    env.pop("DEW_COMPILE_CACHE", None)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    process_s = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name}: dew train failed: {done.stderr[-2000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    record = json.loads((run_dir / "run" / "metrics.jsonl").read_text().splitlines()[0])
    tokens = args.batch * args.seq_len  # a token file's rows are full: every id is predicted
    entries = 0 if cache is None else sum(1 for p in cache.rglob("*") if p.is_file())
    return {"first step": tokens / record["tokens_per_s"], "process": process_s,
            "hits": result["hits"], "misses": result["misses"], "entries": entries,
            "programs": result["programs"],
            **{phase: result[phase] for phase in PHASES}}  # fmt: skip


NAMES = ("cold", "warm", "off", "cold scan", "warm scan")


def slowest_programs(runs: list[dict[str, float]], most: int = 4) -> str:
    """``jit(step) 1.91 s, ...``: each program's median backend-compile seconds over the
    runs (0 in a run that did not compile it), slowest first."""
    names = {name for run in runs for name in run}
    median = {n: statistics.median(run.get(n, 0.0) for run in runs) for n in names}
    top = sorted(median.items(), key=lambda kv: -kv[1])[:most]
    return ", ".join(f"{name} {secs:.2f} s" for name, secs in top)


def scan_flag(name: str) -> tuple[str, ...]:
    """The extra flag of a contender: ``--scan-layers`` for the ``... scan`` ones."""
    return ("--scan-layers",) if name.endswith("scan") else ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per row")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    add_device_argument(parser)
    parser.add_argument("--model-args", default="",
                        help="model flags for every run, e.g. '--emb-features 1024 --layers 28' "
                        "(default: the CLI's own small qwen3)")  # fmt: skip
    parser.add_argument("--contenders", default=",".join(NAMES),
                        help=f"which of {', '.join(NAMES)} to run (comma-separated)")  # fmt: skip
    args = parser.parse_args()
    names = tuple(args.contenders.split(","))
    if set(names) - set(NAMES):  # an empty value splits to ('',): refused here too
        parser.error(
            f"--contenders: expected names from {', '.join(NAMES)}, got {args.contenders!r}"
        )
    bench = Bench("first_step", cpus=args.cpus, threads=args.threads, device=args.device)
    import numpy as np

    work = Path(tempfile.mkdtemp(prefix="dew-first-step-"))
    rng = np.random.default_rng(0)
    np.save(work / "tokens.npy", rng.integers(0, 4096, 200_000).astype(np.uint16))
    warm_caches: dict[str, Path] = {}
    for name in names:  # each warm contender's cache, filled once before the rounds
        if name.startswith("warm"):
            warm_caches[name] = work / f"{name.replace(' ', '-')}-cache"
            primed = one_run(work, "prime", warm_caches[name], args, scan_flag(name))
            bench.say(f"primed the {name} cache: {primed['entries']} entries, "
                      f"{primed['misses']} misses")  # fmt: skip
    counts: dict[str, list[tuple[int, int, int]]] = {}
    programs: dict[str, list[dict[str, float]]] = {}

    def contender(name: str):
        def run() -> dict[str, float]:
            cache = Path(tempfile.mkdtemp(prefix="cold-cache-", dir=work)) if name.startswith(
                "cold") else warm_caches.get(name)  # fmt: skip
            extra = scan_flag(name)
            got = one_run(work, name, cache, args, extra)
            counts.setdefault(name, []).append((got["hits"], got["misses"], got["entries"]))
            programs.setdefault(name, []).append(got["programs"])
            return {part: got[part] for part in ("first step", "process", *PHASES)}

        return run

    times = bench.rounds({n: contender(n) for n in names}, rounds=args.rounds)
    shape = args.model_args or "qwen3 256x4"
    bench.say(f"dew train lm --steps 1, {shape}, batch {args.batch}, seq_len {args.seq_len}, "
              f"JAX on {args.device}")  # fmt: skip
    for name in names:
        for part in ("first step", "process", *PHASES):
            bench.show(f"{name} {part}", times[f"{name} {part}"], scale=1.0, unit=" s", digits=2)
        hits = ", ".join(f"{h} hits/{m} misses/{e} entries" for h, m, e in counts[name])
        bench.say(f"  {name} cache per round: {hits}")
        bench.say(f"  {name} backend compile by program (median of rounds): "
                  f"{slowest_programs(programs[name])}")  # fmt: skip
    for part in ("first step", "process"):
        pairs = (("cold", "warm"), ("off", "warm"), ("cold scan", "cold"),
                 ("cold scan", "warm scan"), ("warm", "warm scan"))  # fmt: skip
        for a, b in pairs:
            if a in names and b in names:
                bench.compare(f"{part}: {a} / {b}", times[f"{a} {part}"], times[f"{b} {part}"])
    bench.finish({"seq_len": args.seq_len, "batch": args.batch, "counts": counts,
                  "programs": programs})  # fmt: skip


if __name__ == "__main__":
    main()

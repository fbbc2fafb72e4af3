"""The shared harness of every benchmark in ``tools/bench/``: interleaved rounds, pinning,
median and spread, ratios with a verdict, and a JSON machine record.

How a bench uses it::

    from _rounds import Bench

    bench = Bench("sft", cpus="0,1", threads=2)   # pins and sets thread flags BEFORE jax loads
    ...                                          # build the contenders
    times = bench.rounds({"dew": dew_step, "torch": torch_step, "peak": peak}, rounds=5)
    bench.compare("dew vs torch", times["torch"], times["dew"], goal=1.2)
    bench.finish({"extra": ...})                 # prints the load, writes results/sft.json

Rules the harness enforces, so that a number survives someone else re-running the command:

- contenders run interleaved: one call of each per round, the order rotating every round,
  at least 3 rounds; a peak or floor (matmul peak, copy bandwidth) is just another contender,
  so it is measured inside the same rounds as the code it is compared with;
- both sides are pinned to the same CPUs (``os.sched_setaffinity``; child processes inherit
  it) with the same thread count: XLA's CPU pool follows the affinity mask (one thread:
  ``--xla_cpu_multi_thread_eigen=false`` in ``XLA_FLAGS``) and torch,
  OpenMP and MKL through the environment (``DEW_BENCH_THREADS``, which the reference
  scripts read and pass to ``torch.set_num_threads``);
- each contender is summarised by the median and the spread (min-max) of its round values;
- a ratio is the ratio of medians, with the spread of the per-round ratios (the contenders of
  one round share that round's load). A goal is "met" when every per-round ratio reaches it,
  "not met" when none does, and "not shown" when the spread crosses it;
- JAX's persistent compilation cache is off (``DEW_COMPILE_CACHE=0`` unless set), so a
  first step's time is a fresh compile's in every run;
- the machine record (CPU model, AMX / AVX-512 / AVX2 / FMA flags, core count, affinity,
  thread flags, load average before and after) is written atomically under
  ``tools/bench/results/<name>.json``.

On a shared machine, pin one CPU with one thread (``--cpus 1 --threads 1``): with two
threads on two busy cores, torch's OpenMP workers wait on each other whenever another
process holds a core, and its step times grow several-fold (far more than XLA's), which
inflates every ratio in Dew's favour. A number for a note comes from the pinned run.

Pure standard library, so the statistics are unit-tested without jax or torch.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
MIN_ROUNDS = 3
SHARED = (
    "other jobs may share the machine (the load averages say how busy it was), so absolute "
    "numbers carry that load; read the spreads and the same-round ratios"
)
FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4")


@dataclass(frozen=True)
class Spread:
    """Median and min-max of a list of values (seconds, or any positive quantity)."""

    median: float
    low: float
    high: float
    count: int

    def text(self, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
        f = f"{{:.{digits}f}}"
        m, lo, hi = (f.format(v * scale) for v in (self.median, self.low, self.high))
        return f"{m}{unit} ({lo}-{hi})"


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of ``values``; refuses an empty list by name."""
    if len(values) == 0:
        raise ValueError("spread: expected at least one value, got an empty list")
    return Spread(statistics.median(values), min(values), max(values), len(values))


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` as a ratio of medians, with the per-round ratios' spread.

    ``verdict`` is ``"met"`` when the lowest per-round ratio reaches ``goal``, ``"not met"``
    when even the highest stays below it, ``"not shown"`` when the spread crosses it, and
    ``"no goal"`` without one.
    """

    label: str
    value: float
    low: float
    high: float
    goal: float | None
    verdict: str

    def text(self) -> str:
        goal = "" if self.goal is None else f"  goal >= {self.goal:g}: {self.verdict}"
        return f"{self.label}: {self.value:.2f}x (per-round {self.low:.2f}-{self.high:.2f}){goal}"


def verdict(low: float, high: float, goal: float | None) -> str:
    """The goal rule: met when the whole spread reaches it, not met when none does."""
    if goal is None:
        return "no goal"
    if low >= goal:
        return "met"
    if high < goal:
        return "not met"
    return "not shown"


def ratio(
    label: str,
    numerator: Sequence[float],
    denominator: Sequence[float],
    goal: float | None = None,
) -> Ratio:
    """Ratio of medians of two same-length round series, spread over the paired rounds.

    For times, pass the slower peer's times as ``numerator`` (peer / ours: above 1 means ours
    is faster); for throughputs, ours first.
    """
    if len(numerator) != len(denominator):
        raise ValueError(
            f"ratio {label!r}: expected one value per round on both sides, got "
            f"{len(numerator)} and {len(denominator)}"
        )
    if len(numerator) == 0:
        raise ValueError(f"ratio {label!r}: expected at least one round, got none")
    if min(denominator) <= 0:
        raise ValueError(f"ratio {label!r}: denominator values must be > 0, got {min(denominator)}")
    per_round = [a / b for a, b in zip(numerator, denominator)]
    value = statistics.median(numerator) / statistics.median(denominator)
    low, high = min(per_round), max(per_round)
    return Ratio(label, value, low, high, goal, verdict(low, high, goal))


Value = float | Sequence[float]


def _value(got: Value) -> float:
    return float(got) if isinstance(got, int | float) else statistics.median(got)


def run_rounds(
    contenders: Mapping[str, Callable[[], Value | Mapping[str, Value]]],
    rounds: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Call every contender once per round, the order rotating by one each round.

    A contender returns its measured value (seconds, or a list of repeats whose median is
    the round's value), or a mapping of such values: then each key is its own series, named
    ``"<contender> <key>"`` (a step's phases, a save and a restore). Returns one value per
    round per series.
    """
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds: expected at least {MIN_ROUNDS}, got {rounds}")
    if not contenders:
        raise ValueError("contenders: expected at least one, got none")
    names = list(contenders)
    out: dict[str, list[float]] = {}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            got = contenders[name]()
            values = (
                {f"{name} {k}": _value(v) for k, v in got.items()}
                if isinstance(got, Mapping)
                else {name: _value(got)}
            )
            for series, value in values.items():
                out.setdefault(series, []).append(value)
                if log is not None:
                    log(f"round {r + 1}/{rounds} {series}: {value:.6g}")
    return out


def cpu_info() -> dict[str, Any]:
    """CPU model, the vector/matrix flags that matter here, cores and this process's CPUs."""
    info: dict[str, Any] = {"cpu_model": platform.processor() or "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name"):
            info["cpu_model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            info["flags"] = sorted(f for f in line.split(":", 1)[1].split()
                                   if f.startswith(FLAG_PREFIXES))  # fmt: skip
            break
    flags = set(info["flags"])
    info["amx"] = bool(flags & {"amx_tile", "amx_bf16", "amx_int8"})
    info["avx512"] = "avx512f" in flags
    info["cores"] = os.cpu_count()
    info["affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    info["platform"] = platform.platform()
    info["python"] = platform.python_version()
    return info


def accelerator_info() -> dict[str, Any]:
    """The accelerator JAX runs on: device kind and count, and ``nvidia-smi``'s line if any."""
    import jax

    info: dict[str, Any] = {"jax": jax.__version__, "kinds": [d.device_kind for d in jax.devices()]}
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        info["nvidia_smi"] = done.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = []
    return info


def thread_env(threads: int) -> dict[str, str]:
    """Environment for one thread count on both sides (XLA here, torch in the children)."""
    env = {
        "DEW_BENCH_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    xla = os.environ.get("XLA_FLAGS", "")
    parts = [p for p in xla.split() if "intra_op_parallelism" not in p
             and "multi_thread_eigen" not in p]  # fmt: skip
    if threads == 1:  # XLA's CPU client otherwise sizes its pool by the affinity mask
        parts += ["--xla_cpu_multi_thread_eigen=false"]
    env["XLA_FLAGS"] = " ".join(parts)
    return env


def parse_cpus(cpus: str) -> set[int]:
    """``"0,1"`` or ``"0-3"`` -> CPU ids; an empty string means every CPU this process has."""
    if not cpus:
        return set(os.sched_getaffinity(0))
    out: set[int] = set()
    for part in cpus.split(","):
        try:
            if "-" in part:
                a, b = part.split("-")
                out.update(range(int(a), int(b) + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"--cpus: expected ids like 0,1 or 0-3, got {cpus!r}") from None
    return out


def reference_python() -> str:
    """The reference interpreter (torch CPU, transformers, TRL, verl): tools/reference_env.sh.

    ``DEW_REFERENCE_PYTHON`` names another one instead (an accelerator machine's own torch).
    """
    if os.environ.get("DEW_REFERENCE_PYTHON"):
        return os.environ["DEW_REFERENCE_PYTHON"]
    done = subprocess.run(["bash", str(ROOT / "tools" / "reference_env.sh")], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def revision_env(revision: str, into: Path) -> dict[str, str]:
    """Environment that makes this interpreter import Dew as of git ``revision``.

    Extracts ``packages/`` of that revision (``git archive``) under ``into`` and puts every
    distribution's ``src`` first on ``PYTHONPATH``, ahead of the workspace's editable
    installs; the rest of the environment (pinning, thread flags) is this process's. A
    bench's ``--base REV`` runs the same contender code against that revision's library
    in a worker, in the same interleaved rounds as the working tree's.
    """
    import io
    import tarfile

    done = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "packages"],
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        raise ValueError(f"--base: git archive of {revision!r} failed: {done.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(into, filter="data")
    sources = sorted(str(p) for p in (into / "packages").glob("*/src"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*sources, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def revision_name(revision: str) -> str:
    """``revision`` and its short commit id, for labels (``main@4ff3d28``)."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", revision],
                          capture_output=True, text=True)  # fmt: skip
    return f"{revision}@{done.stdout.strip()}" if done.returncode == 0 else revision


class Worker:
    """A reference-side process spoken to over JSON lines (one request, one reply line).

    The child inherits this process's CPU affinity and thread environment.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=None if env is None else dict(env))  # fmt: skip
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.proc.args!r} exited with {self.proc.wait()}")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"worker: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Bench:
    """One benchmark run: pinning, rounds, ratios and the machine record.

    Create it before importing jax (the thread flags are read when XLA starts).
    """

    def __init__(self, name: str, cpus: str = "", threads: int = 0, device: str = "cpu") -> None:
        # A run on an accelerator keeps its own record beside the CPU one (``<name>_cuda``).
        self.name = name if device == "cpu" else f"{name}_{device}"
        self.device = device
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, parse_cpus(cpus))
        pinned = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        if threads not in (0, 1, pinned):
            raise ValueError(
                f"--threads: expected 0, 1 or the number of pinned CPUs ({pinned}), got {threads}"
                " (XLA's CPU pool follows the affinity mask; pin fewer CPUs instead)"
            )
        self.threads = threads if threads > 0 else pinned
        os.environ.update(thread_env(self.threads))
        os.environ.setdefault("JAX_PLATFORMS", device)
        if device != "cpu":  # the torch worker shares the card: JAX takes memory as it goes
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        # A first step or compile time measures a fresh compile, not a hit in the persistent
        # cache a Trainer turns on (dew.compile_cache); DEW_COMPILE_CACHE=1 measures hits.
        os.environ.setdefault("DEW_COMPILE_CACHE", "0")
        self.load_before = os.getloadavg()
        self.started = time.time()
        self.series: dict[str, dict[str, list[float]]] = {}
        self.ratios: list[Ratio] = []
        self.lines: list[str] = []

    def rounds(
        self,
        contenders: Mapping[str, Callable[[], Value | Mapping[str, Value]]],
        rounds: int,
        group: str = "main",
        verbose: bool = True,
    ) -> dict[str, list[float]]:
        """Interleaved rounds (see :func:`run_rounds`); the series are kept for the record."""
        log = (lambda s: print(f"  [{group}] {s}", flush=True)) if verbose else None
        out = run_rounds(contenders, rounds, log)
        self.series.setdefault(group, {}).update(out)
        return out

    def say(self, line: str) -> None:
        """Print a result line and keep it for the record."""
        print(line, flush=True)
        self.lines.append(line)

    def show(
        self,
        label: str,
        values: Sequence[float],
        scale: float = 1e3,
        unit: str = " ms",
        digits: int = 1,
        extra: str = "",
    ) -> Spread:
        """Print one contender's median and spread (and ``extra`` after them)."""
        s = spread(values)
        self.say(f"  {label:28s} median {s.text(scale, unit, digits)}  {extra}".rstrip())
        return s

    def compare(self, label: str, numerator: Sequence[float], denominator: Sequence[float],
                goal: float | None = None) -> Ratio:  # fmt: skip
        """Print and keep a ratio of medians with its per-round spread and verdict."""
        r = ratio(label, numerator, denominator, goal)
        self.ratios.append(r)
        self.say("  " + r.text())
        return r

    def finish(self, payload: Mapping[str, Any] | None = None) -> Path:
        """Print the load line and write ``results/<name>.json`` atomically."""
        load_after = os.getloadavg()
        self.say(
            f"machine: {cpu_info()['cpu_model']}, {os.cpu_count()} cores, pinned to CPUs "
            f"{sorted(os.sched_getaffinity(0))} with {self.threads} threads; load average "
            f"{self.load_before[0]:.2f} -> {load_after[0]:.2f}; {SHARED}"
        )
        record = {
            "bench": self.name,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "started_unix": self.started,
            "seconds": time.time() - self.started,
            "machine": cpu_info(),
            "accelerator": accelerator_info() if self.device != "cpu" else None,
            "threads": self.threads,
            "env": {
                k: os.environ.get(k, "")
                for k in ("XLA_FLAGS", "DEW_BENCH_THREADS", "OMP_NUM_THREADS", "JAX_PLATFORMS")
            },  # fmt: skip
            "load_before": list(self.load_before),
            "load_after": list(load_after),
            "shared_machine": SHARED,
            "series": self.series,
            "summary": {
                g: {n: asdict(spread(v)) for n, v in s.items()} for g, s in self.series.items()
            },  # fmt: skip
            "ratios": [asdict(r) for r in self.ratios],
            "printed": self.lines,
            **(payload or {}),
        }
        return write_record(self.name, record)


def write_record(name: str, record: Mapping[str, Any], directory: Path = RESULTS) -> Path:
    """Write ``<directory>/<name>.json`` through a temporary file and ``os.replace``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    print(f"machine record: {path}", flush=True)
    return path


def add_arguments(parser: Any, rounds: int = 5) -> None:
    """The flags every bench shares: --rounds, --cpus, --threads."""
    parser.add_argument("--rounds", type=int, default=rounds,
                        help=f"interleaved rounds (at least {MIN_ROUNDS})")  # fmt: skip
    parser.add_argument("--cpus", default="",
                        help="pin both sides to these CPUs, e.g. 0 or 0,1 (default: all)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for both sides (XLA intra-op pool, torch); "
                        "0: one per pinned CPU")  # fmt: skip


def mfu(flops: float, seconds: float, peak_tflops: float) -> float | None:
    """Model FLOPs utilisation: ``flops`` done in ``seconds`` over a peak of ``peak_tflops``
    TFLOP/s (``--peak-tflops``); None without a peak (0)."""
    return flops / seconds / (peak_tflops * 1e12) if peak_tflops > 0 else None


def mfu_text(flops: float, seconds: float, peak_tflops: float) -> str:
    """``"  MFU 0.123"`` for a result line's extra, or ``""`` without a peak."""
    value = mfu(flops, seconds, peak_tflops)
    return "" if value is None else f"  MFU {value:.3f}"


def add_device_argument(parser: Any) -> None:
    """The --device flag, defined once for every bench that takes it (the model benches through
    ``_shapes.add_model_arguments``, and ``bench_first_step``)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the bench runs: cpu, or cuda (JAX's cuda platform, and "
                        "torch's cuda device where a bench has a torch side, on one card; the "
                        "record is <bench>_cuda.json)")  # fmt: skip


def jnp_dot_peak(flops: float, reps: int = 10, device: str = "cpu") -> Callable[[], float]:
    """A contender giving the seconds ``flops`` take at ``jnp.dot``'s peak rate, measured each
    call over ``reps`` square products (compiled once here): float32 1024-square on a CPU,
    bfloat16 8192-square on an accelerator (the shape and type its matrix units peak at). The
    reference workers' side is ``torch_matmul_peak`` in ``WORKER_LOOP``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n, dtype = (1024, jnp.float32) if device == "cpu" else (8192, jnp.bfloat16)
    square = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    dot = jax.jit(lambda x, y: x @ y)
    dot(square, square).block_until_ready()

    def at_peak() -> float:
        start = time.perf_counter()
        for _ in range(reps):
            product = dot(square, square)
        product.block_until_ready()
        return flops / (2 * n**3 * reps / (time.perf_counter() - start))

    return at_peak


WORKER_LOOP = r"""
import json, os, sys, time, traceback
def serve(handlers, info):
    '''JSON-lines loop of a reference worker: {"op": name, ...} -> handlers[name](**rest).'''
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "quit":
            break
        try:
            reply = handlers[op](**request)
        except Exception:
            reply = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps(reply), flush=True)
def torch_matmul_peak(torch, reps, device="cpu"):
    '''torch's matmul rate, FLOP/s (as jnp_dot_peak): float32 1024-square on a CPU,
    bfloat16 8192-square on an accelerator.'''
    n, dtype = (1024, torch.float32) if device == "cpu" else (8192, torch.bfloat16)
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    sync(torch, device)
    t = time.perf_counter()
    for _ in range(reps): a @ b
    sync(torch, device)
    return {"flops_per_s": 2 * n ** 3 * reps / (time.perf_counter() - t)}
def sync(torch, device):
    if device != "cpu":
        torch.cuda.synchronize()
def torch_threads(torch):
    n = int(os.environ.get("DEW_BENCH_THREADS", "0"))
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()
"""
"""Prepended to a reference worker's script: ``serve(handlers, info)`` and ``torch_threads``."""

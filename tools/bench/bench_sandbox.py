"""Sandbox throughput: ProcessRunner fleets against plain subprocess.run, and containers.

Runs the same trivial Python program (``print(sum(range(100)))`` from ``main.py``):

* one by one with ``subprocess.run`` in a temporary directory (the peer: no limits, no
  isolation, no cleanup work),
* through ``SandboxFleet(ProcessRunner(), workers=1)`` and ``workers=2``,
* through ``ContainerRunner`` (one worker), when an engine answers (``DOCKER_HOST``).

The contenders run in interleaved rounds (tools/bench/_rounds.py), pinned to the same CPUs.
Prints seconds per program (median and spread) and programs per second per contender, the
ratio of each fleet to the peer with the per-round spread, and the container runner's seconds
per program (engine start-to-removal included). Record: tools/bench/results/sandbox.json.

    .venv/bin/python tools/bench/bench_sandbox.py --programs 60 --containers 12 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments  # noqa: E402

from dew.sandbox import (  # noqa: E402
    ContainerRunner,
    ProcessRunner,
    Program,
    SandboxFleet,
    SandboxLimits,
    Verdict,
    engine_unavailable_reason,
)
from dew.sandbox.launcher import SANDBOX_PATH  # noqa: E402

CODE = "print(sum(range(100)))\n"
# The same interpreter for every contender: the one the sandbox's PATH finds (a bare
# "python3" on the caller's PATH may be a slow shim, e.g. pyenv's).
PYTHON = shutil.which("python3", path=SANDBOX_PATH) or "python3"
LIMITS = SandboxLimits(cpu_seconds=5, deadline_seconds=30)


def bench_subprocess(n: int) -> float:
    """Programs per second with subprocess.run, one after another."""
    with tempfile.TemporaryDirectory() as job:
        with open(os.path.join(job, "main.py"), "w") as f:
            f.write(CODE)
        start = time.perf_counter()
        for _ in range(n):
            done = subprocess.run([PYTHON, "main.py"], cwd=job, capture_output=True, check=True)
            assert done.stdout == b"4950\n"
        return n / (time.perf_counter() - start)


def bench_fleet(n: int, workers: int) -> float:
    """Programs per second through a ProcessRunner fleet."""
    programs = [Program({"main.py": CODE}, [PYTHON, "main.py"]) for _ in range(n)]
    with SandboxFleet(ProcessRunner(), limits=LIMITS, workers=workers) as fleet:
        fleet.run(programs[:2])  # warm the threads
        start = time.perf_counter()
        outcomes = fleet.run(programs)
        elapsed = time.perf_counter() - start
    assert all(o.verdict is Verdict.COMPLETED and o.stdout == b"4950\n" for o in outcomes)
    return n / elapsed


def bench_containers(runner: ContainerRunner, n: int) -> list[float]:
    """Seconds per program through ContainerRunner, one at a time."""
    program = Program({"main.py": CODE}, ["python3", "main.py"])
    times = []
    for _ in range(n):
        start = time.perf_counter()
        outcome = runner.run(program, LIMITS)
        times.append(time.perf_counter() - start)
        assert outcome.verdict is Verdict.COMPLETED and outcome.stdout == b"4950\n"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--programs", type=int, default=60, help="programs per contender a round")
    parser.add_argument("--containers", type=int, default=12, help="containers a round")
    parser.add_argument(
        "--image", default=os.environ.get("DEW_SANDBOX_IMAGE", "dew-sandbox-python:bookworm-stdlib")
    )
    args = parser.parse_args()
    bench = Bench("sandbox", args.cpus, args.threads)
    contenders = {
        "subprocess.run": lambda: 1.0 / bench_subprocess(args.programs),
        "fleet 1 worker": lambda: 1.0 / bench_fleet(args.programs, 1),
        "fleet 2 workers": lambda: 1.0 / bench_fleet(args.programs, 2),
    }
    reason = engine_unavailable_reason(args.image)
    runner = None
    if reason is None:
        runner = ContainerRunner(args.image)
        runner.run(Program({"main.py": CODE}, ["python3", "main.py"]), LIMITS)  # warm caches
        contenders["ContainerRunner"] = lambda: bench_containers(runner, args.containers)
    try:
        times = bench.rounds(contenders, args.rounds)
    finally:
        if runner is not None:
            runner.close()
    bench.say(f"trivial program ({PYTHON}), {args.programs} per contender a round, uid "
              f"{os.geteuid()}; seconds per program (above 1 in a ratio: the fleet is faster)")  # fmt: skip
    for name, values in times.items():
        bench.show(name, values, extra=f"{1 / sorted(values)[len(values) // 2]:7.1f} programs/s")
    for name in ("fleet 1 worker", "fleet 2 workers"):
        bench.compare(f"{name} vs subprocess.run", times["subprocess.run"], times[name])
    if reason is not None:
        bench.say(f"  ContainerRunner: skipped ({reason})")
    bench.finish({"args": vars(args), "python": PYTHON, "containers": reason or "ran"})


if __name__ == "__main__":
    main()

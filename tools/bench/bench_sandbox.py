"""Sandbox throughput: ProcessRunner fleets against plain subprocess.run, and containers.

Runs the same trivial Python program (``print(sum(range(100)))`` from ``main.py``):

* one by one with ``subprocess.run`` in a temporary directory (the peer: no limits, no
  isolation, no cleanup work),
* through ``SandboxFleet(ProcessRunner(), workers=1)`` and ``workers=2``,
* through ``ContainerRunner`` (one worker), when an engine answers (``DOCKER_HOST``).

Prints programs per second, the ratio of each fleet to the peer, and the container
runner's median seconds per program (engine start-to-removal included).

    .venv/bin/python tools/bench/bench_sandbox.py --programs 60 --containers 12
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from dew.sandbox import (
    ContainerRunner,
    ProcessRunner,
    Program,
    SandboxFleet,
    SandboxLimits,
    Verdict,
    engine_unavailable_reason,
)
from dew.sandbox.launcher import SANDBOX_PATH

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


def bench_containers(n: int, image: str) -> list[float]:
    """Seconds per program through ContainerRunner, one at a time."""
    runner = ContainerRunner(image)
    program = Program({"main.py": CODE}, ["python3", "main.py"])
    times = []
    try:
        runner.run(program, LIMITS)  # warm the engine's caches
        for _ in range(n):
            start = time.perf_counter()
            outcome = runner.run(program, LIMITS)
            times.append(time.perf_counter() - start)
            assert outcome.verdict is Verdict.COMPLETED and outcome.stdout == b"4950\n"
    finally:
        runner.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=60)
    parser.add_argument("--containers", type=int, default=12)
    parser.add_argument(
        "--image", default=os.environ.get("DEW_SANDBOX_IMAGE", "dew-sandbox-python:bookworm-stdlib")
    )
    args = parser.parse_args()

    print(
        f"trivial program x {args.programs} ({PYTHON}), cpus={os.cpu_count()}, "
        f"uid={os.geteuid()}, load {os.getloadavg()[0]:.1f}"
    )
    peer = bench_subprocess(args.programs)
    print(f"  subprocess.run one by one      {peer:7.1f} programs/s  (peer)")
    for workers in (1, 2):
        rate = bench_fleet(args.programs, workers)
        print(
            f"  ProcessRunner fleet, {workers} worker{'s' if workers > 1 else ' '}  "
            f"{rate:7.1f} programs/s  ratio {rate / peer:5.2f} x subprocess.run"
        )
    reason = engine_unavailable_reason(args.image)
    if reason is not None:
        print(f"  ContainerRunner: skipped ({reason})")
        return
    times = bench_containers(args.containers, args.image)
    print(
        f"  ContainerRunner, 1 worker      median {statistics.median(times):.3f} s/program "
        f"(min {min(times):.3f}, max {max(times):.3f}, n={len(times)})"
    )


if __name__ == "__main__":
    main()

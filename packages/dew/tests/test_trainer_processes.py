"""Real processes: two JAX processes training together (stopped by a signal to one of them,
then resumed), and a run killed with SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import numpy as np

from dew.testing import Finished, ProcessGroup, run_processes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_train_worker.py")


def run(args: list[str], timeout: float = 300) -> Finished:
    (proc,) = run_processes(WORKER, *args, timeout=timeout)
    return proc


def leaves(path) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def launch_two(out, steps: str, run_dir, *extra: str) -> ProcessGroup:
    """Two worker processes of two devices each, joined through jax.distributed."""
    return ProcessGroup(WORKER, out, steps, "--devices", 2, "--run-dir", run_dir, *extra,
                        processes=2)  # fmt: skip


def finish(group: ProcessGroup, expect: int) -> list[tuple[int, str, str]]:
    with group:
        return [(p.returncode, p.stdout, p.stderr) for p in group.wait(300, expect)]


def test_two_processes_stop_together_resume_and_match_one(tmp_path):
    """Two processes of two devices each train on the global batch of one process of four,
    with parameters and optimizer state sharded over the four devices (FSDP). A SIGTERM to
    process 1 alone stops both after the same step, each writing its own shards of that
    step's checkpoint; the rerun resumes there and ends where one process of four does."""
    run([str(tmp_path / "single.npz"), "4", "--devices", "4"])
    run_dir = tmp_path / "run"
    group = launch_two(tmp_path / "multi.npz", "4", run_dir, "--fsdp", "--sleep", "1.0")
    deadline = time.time() + 240
    while time.time() < deadline and group.running():
        if (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text():
            break  # step 1 is logged: both processes are inside fit, handlers installed
        time.sleep(0.05)
    group.procs[1].send_signal(signal.SIGTERM)
    ends = finish(group, expect=3)
    for code, out, err in ends:
        assert code == 3, out + err[-3000:]
    stopped = {out.split("interrupted ", 1)[1].split()[0] for _, out, _ in ends}
    assert len(stopped) == 1, [out for _, out, _ in ends]  # the same step on both processes
    step = int(stopped.pop())
    assert 1 <= step < 4
    for _, out, _ in ends:  # both name the signal and the process that received it
        assert f"interrupted {step} SIGTERM 1" in out
    saved = run_dir / "checkpoints" / f"step_{step:08d}"
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]
    meta = json.loads((saved / "meta.json").read_text())
    assert (meta["format"], meta["processes"], meta["position"]) == (2, 2, step)
    for p in (0, 1):  # orbax's per-process stores: each process wrote the shards it holds
        written = [n for n in meta["sha256"] if n.startswith(f"state/ocdbt.process_{p}/d/")]
        assert written, sorted(meta["sha256"])
    ends = finish(launch_two(tmp_path / "multi.npz", "4", run_dir, "--fsdp"), expect=0)
    for code, out, err in ends:
        assert code == 0 and "done 4" in out, err[-3000:]
    assert f"resuming from step {step}" in ends[0][2]
    steps = [json.loads(x)["step"] for x in open(run_dir / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]
    single, multi = leaves(tmp_path / "single.npz"), leaves(tmp_path / "multi.npz")
    assert len(single) == len(multi)
    for a, b in zip(single, multi):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the comparison is not vacuous: training moved the weights well past the tolerance
    run([str(tmp_path / "init.npz"), "0", "--devices", "4"])
    init = leaves(tmp_path / "init.npz")
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(init, single) if a.dtype.kind == "f") > 1e-3
    )


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    steps = 8
    run([str(tmp_path / "full.npz"), str(steps)])
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    with ProcessGroup(WORKER, tmp_path / "killed.npz", steps, "--run-dir", run_dir,
                      "--checkpoint-every", 1, "--sleep", 0.3) as group:  # fmt: skip
        proc = group.procs[0]
        target = random.Random().randint(1, steps - 3)
        deadline = time.time() + 240
        while time.time() < deadline:
            names = os.listdir(ckpts) if ckpts.exists() else []
            done = [n for n in names if n.startswith("step_")]
            if len(done) >= min(target, 3) or proc.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(random.Random().uniform(0.0, 0.3))
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        group.wait(60, expect=-signal.SIGKILL)
    assert not (tmp_path / "killed.npz").exists()
    before = sorted(n for n in os.listdir(ckpts) if n.startswith("step_"))
    assert before and before[-1] < f"step_{steps:08d}"
    run([str(tmp_path / "killed.npz"), str(steps), "--run-dir", str(run_dir),
         "--checkpoint-every", "1"])  # fmt: skip
    full, resumed = leaves(tmp_path / "full.npz"), leaves(tmp_path / "killed.npz")
    assert len(full) == len(resumed)
    for a, b in zip(full, resumed):
        np.testing.assert_array_equal(a, b)
    steps_logged = [int(line.split('"step": ')[1].split(",")[0])
                    for line in open(run_dir / "metrics.jsonl")]  # fmt: skip
    assert steps_logged[-1] == steps

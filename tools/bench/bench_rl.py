"""Benchmark a GRPO-style loss step of dew.rl under jax.jit against verl 0.9.1 eager torch.

The step: token log ratio, dual-clipped surrogate (eps 0.2 / 0.28, dual clip 3.0), k3 KL to a
reference policy with coefficient 0.04, token-mean reduction; forward and backward to the
policy log-probabilities, float32 [B, T] inputs. Implementations, on the same inputs:

- ``dew.rl``: the composition of dew.rl functions, ``jax.jit(jax.value_and_grad(...))``;
- ``dew+remat``: the same composition under ``jax.checkpoint``, so the backward pass
  recomputes the exponentials from the inputs instead of reading stored copies;
- ``fused``: the same loss and its derivative written by hand as two elementwise passes
  (see :func:`fused_value_and_grad`), to show what one jitted step can reach; it is not the
  library's code path;
- ``verl``: verl's compute_policy_loss_vanilla + kl_penalty(k3) + agg_loss with autograd, in
  eager torch, in a worker process under the reference venv (tools/reference_env.sh).

The runs are interleaved in rounds (verl, the copy, each jax implementation, again) so that
load from other processes on the machine falls on all of them alike; the median and the
minimum over all runs are printed, with the ratios verl / jax of the medians and of the
minima, and the median process CPU time of a step (on a loaded machine the long verl steps
are interrupted more often than the short jax ones, which inflates the wall-clock ratio; CPU
time does not count the time a process waits for a core, so with ``--cpus 0`` pinning both
sides to one core the CPU-time ratio is the one load does not move). The same rounds
measure the bandwidth of a large array copy (read + write bytes per second); the memory floor
of a step is the bytes it must move (read four float32 inputs and the bool mask, write the
float32 gradient: 21 bytes a token) over that bandwidth, and "floor fraction" is that floor
over the measured time (1.0 would be at the floor; above 1 means the working set sat in a
cache, which the copy is sized to miss).

Usage: .venv/bin/python tools/bench/bench_rl.py [--rounds 5] [--repeats 20]
       [--sizes 32x512,256x2048] [--torch-threads N] [--cpus 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CLIP_LOW, CLIP_HIGH, CLIP_C, KL_COEF = 0.2, 0.28, 3.0, 0.04
BYTES_PER_TOKEN = 4 * 4 + 1 + 4  # read lp, old, ref, adv (f32) and mask (bool); write grad
ARG_ORDER = ("log_prob", "old_log_prob", "ref_log_prob", "advantages", "response_mask")


def make_inputs(b: int, t: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 [B, T] inputs: log-probs, per-sequence advantages, a padded-tail mask."""
    rng = np.random.default_rng(seed)
    old = (-np.abs(rng.standard_normal((b, t))) * 2.0).astype(np.float32)
    log_prob = (old + 0.2 * rng.standard_normal((b, t))).astype(np.float32)
    ref = (log_prob + 0.2 * rng.standard_normal((b, t))).astype(np.float32)
    adv = np.repeat(rng.standard_normal((b, 1)), t, axis=1).astype(np.float32)
    lengths = rng.integers(t // 4, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    return {
        "log_prob": log_prob,
        "old_log_prob": old,
        "ref_log_prob": ref,
        "advantages": adv,
        "response_mask": mask,
    }


def dew_loss(lp: jax.Array, old: jax.Array, ref: jax.Array, adv: jax.Array, mask: jax.Array):
    """The GRPO-style loss as a plain composition of dew.rl functions."""
    from dew import rl

    pg, _ = rl.clipped_surrogate(
        rl.token_log_ratio(lp, old), adv, mask, CLIP_LOW, CLIP_HIGH, CLIP_C
    )
    return pg + KL_COEF * rl.token_mean(rl.k3_kl(lp, ref), mask)


def _terms_and_grad(lp, old, ref, adv, mask, inv_n):  # type: ignore[no-untyped-def]
    """Per-token loss terms and d(loss)/d(lp), following verl's branches and clamps.

    The ratio's derivative is zero where the log ratio is clamped at +-20; the clipped branch
    carries a gradient only strictly inside its band; the dual-clip constant carries none;
    k3's derivative is zero where either of its clamps binds.
    """
    d = lp - old
    r = jnp.exp(jnp.clip(d, -20.0, 20.0))
    dr = jnp.where((d > -20.0) & (d < 20.0), r, 0.0)
    l1 = -adv * r
    l2 = -adv * jnp.clip(r, 1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
    m = jnp.maximum(l1, l2)
    in_band = (r > 1.0 - CLIP_LOW) & (r < 1.0 + CLIP_HIGH)
    g_m = jnp.where(l2 > l1, jnp.where(in_band, -adv, 0.0), -adv)
    l3 = -adv * CLIP_C
    dual = (adv < 0) & (m > l3)
    pg = jnp.where(dual, l3, m)
    g_pg = jnp.where(dual, 0.0, g_m) * dr
    kl = ref - lp
    klc = jnp.clip(kl, -20.0, 20.0)
    e = jnp.exp(klc)
    k = e - klc - 1.0
    g_k = jnp.where((k < 10.0) & (kl > -20.0) & (kl < 20.0), 1.0 - e, 0.0)
    terms = jnp.where(mask, pg + KL_COEF * jnp.clip(k, -10.0, 10.0), 0.0)
    grad = jnp.where(mask, (g_pg + KL_COEF * g_k) * inv_n, 0.0)
    return terms, grad


def fused_value_and_grad(lp, old, ref, adv, mask):  # type: ignore[no-untyped-def]
    """Loss and gradient in two passes over the inputs, no [B, T] intermediate kept.

    XLA on CPU neither fuses a reduction with the elementwise work that feeds it nor
    recomputes an exponential for two consumers, so jax.value_and_grad of the composition
    writes the exponentials and the masked terms out and reads them back. Here the loss pass
    and the gradient pass each recompute everything from the inputs; the optimization
    barrier keeps XLA from merging the two passes' exponentials into one stored array.
    """
    inv_n = 1.0 / jnp.sum(mask, dtype=jnp.float32)
    terms, _ = _terms_and_grad(lp, old, ref, adv, mask, inv_n)
    again = jax.lax.optimization_barrier((lp, old, ref, adv, mask))
    _, grad = _terms_and_grad(*again, inv_n)
    return jnp.sum(terms) * inv_n, grad


def copy_seconds(src: np.ndarray, dst: np.ndarray, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times


def time_calls(fn: Callable, args: tuple, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of ``repeats`` calls."""
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        cpu.append(time.process_time() - start_cpu)
        times.append(time.perf_counter() - start)
    return times, cpu


class VerlWorker:
    """verl_grpo_step.py in the reference venv, spoken to over JSON lines."""

    def __init__(self, threads: int) -> None:
        python = subprocess.run(
            ["bash", str(ROOT / "tools" / "reference_env.sh")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()[-1]
        script = str(Path(__file__).with_name("verl_grpo_step.py"))
        self.proc = subprocess.Popen(
            [python, script, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"verl worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="runs per round")
    parser.add_argument("--sizes", default="32x512,256x2048")
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument(
        "--cpus",
        default="",
        help="pin this process and the verl worker to these CPUs (e.g. 0), before jax starts "
        "its thread pool, so both sides get the same cores",
    )
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    src = np.ones(64 * 2**20, dtype=np.float32)  # 256 MiB: far past any cache here
    dst = np.empty_like(src)
    np.copyto(dst, src)
    impls: dict[str, Callable] = {
        "dew.rl": jax.jit(jax.value_and_grad(dew_loss)),
        "dew+remat": jax.jit(jax.value_and_grad(jax.checkpoint(dew_loss))),
        "fused": jax.jit(fused_value_and_grad),
    }
    worker = VerlWorker(args.torch_threads)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"{len(os.sched_getaffinity(0))} of {os.cpu_count()} CPUs; "
        f"verl worker torch {worker.info['torch']} with {worker.info['threads']} threads; "
        f"{args.rounds} rounds x {args.repeats} runs, interleaved"
    )
    summary: list[dict[str, Any]] = []
    copy_times: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for b, t in sizes:
                inputs = make_inputs(b, t)
                path = os.path.join(tmp, f"inputs_{b}x{t}.npz")
                np.savez(path, **inputs, clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                         clip_c=CLIP_C, kl_coef=KL_COEF)  # fmt: skip
                checks = {"verl": worker.ask({"load": path})}
                jargs = tuple(jax.device_put(inputs[k]) for k in ARG_ORDER)
                for name, fn in impls.items():
                    loss, grad = jax.block_until_ready(fn(*jargs))  # compile and warm up
                    fn(*jargs)
                    checks[name] = {
                        "loss": float(loss),
                        "grad_abs_sum": float(jnp.sum(jnp.abs(grad))),
                    }
                times: dict[str, list[float]] = {name: [] for name in ("verl", *impls)}
                cpu: dict[str, list[float]] = {name: [] for name in times}
                for _ in range(args.rounds):
                    got = worker.ask({"time": args.repeats})
                    times["verl"] += got["times_s"]
                    cpu["verl"] += got["cpu_s"]
                    copy_times += copy_seconds(src, dst, max(3, args.repeats // 5))
                    for name, fn in impls.items():
                        wall, used = time_calls(fn, jargs, args.repeats)
                        times[name] += wall
                        cpu[name] += used
                bandwidth = 2 * src.nbytes / statistics.median(copy_times)
                floor = b * t * BYTES_PER_TOKEN / bandwidth
                print(
                    f"\n[{b}, {t}] float32, {b * t} tokens, {b * t * BYTES_PER_TOKEN / 2**20:.1f}"
                    f" MiB to move; copy bandwidth {bandwidth / 1e9:.1f} GB/s -> floor "
                    f"{floor * 1e6:.0f} us"
                )
                verl_median = statistics.median(times["verl"])
                verl_min = min(times["verl"])
                verl_cpu = statistics.median(cpu["verl"])
                row: dict[str, Any] = {"shape": [b, t], "floor_s": floor}
                for name, ts in times.items():
                    med, best = statistics.median(ts), min(ts)
                    med_cpu = statistics.median(cpu[name])
                    print(
                        f"  {name:9s} wall median {med * 1e3:8.3f} ms (min {best * 1e3:7.3f}) "
                        f"cpu median {med_cpu * 1e3:8.3f} ms | "
                        f"verl/this: wall {verl_median / med:6.1f}x"
                        f" (minima {verl_min / best:6.1f}x, cpu {verl_cpu / med_cpu:6.1f}x) | "
                        f"floor fraction {floor / med:5.3f} (min {floor / best:5.3f})"
                    )
                    row[name] = {"median_s": med, "min_s": best, "cpu_median_s": med_cpu}
                for name, check in checks.items():
                    print(
                        f"  check {name:9s} loss {check['loss']:+.7f} "
                        f"|grad|_1 {check['grad_abs_sum']:.6f}"
                    )
                summary.append(row)
    finally:
        worker.close()
    print("\n" + json.dumps({"rows": summary}))


if __name__ == "__main__":
    main()

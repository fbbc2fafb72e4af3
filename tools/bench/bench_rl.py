"""Benchmark a GRPO-style loss step of dew.rl under jax.jit against verl 0.9.1 eager torch.

The step: token log ratio, dual-clipped surrogate (eps 0.2 / 0.28, dual clip 3.0), k3 KL to a
reference policy with coefficient 0.04, token-mean reduction; forward and backward to the
policy log-probabilities, float32 [B, T] inputs. Three implementations run on the same inputs:

- ``dew.rl``: the composition of dew.rl functions, ``jax.jit(jax.value_and_grad(...))``;
- ``fused``: the same loss written as one expression with its derivative by hand, to show how
  close to the memory floor a single jitted pass gets (not the library's code path);
- ``verl``: verl's compute_policy_loss_vanilla + kl_penalty(k3) + agg_loss with autograd, eager
  torch, in the reference venv (tools/reference_env.sh) as a subprocess.

Each reports the median of several runs; the ratios verl / jax are printed. The same run
measures the bandwidth of a large array copy (read + write bytes per second) and prints the
fraction of the memory floor achieved: the bytes a step must move (read four float32 inputs
and the bool mask, write the float32 gradient) divided by that bandwidth, over the step time.
A fraction above 1 means the working set sat in cache (the copy is sized to miss it).

Usage: .venv/bin/python tools/bench/bench_rl.py [--repeats 30] [--sizes 32x512,256x2048]
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
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CLIP_LOW, CLIP_HIGH, CLIP_C, KL_COEF = 0.2, 0.28, 3.0, 0.04
# bytes per token the step cannot avoid: log_prob, old, ref, advantages (f32) + mask (bool)
# read, gradient (f32) written.
BYTES_PER_TOKEN = 4 * 4 + 1 + 4


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


def dew_loss(lp, old, ref, adv, mask):  # type: ignore[no-untyped-def]
    """The naive composition of dew.rl functions."""
    from dew import rl

    pg, _ = rl.clipped_surrogate(
        rl.token_log_ratio(lp, old), adv, mask, CLIP_LOW, CLIP_HIGH, CLIP_C
    )
    return pg + KL_COEF * rl.token_mean(rl.k3_kl(lp, ref), mask)


def fused_value_and_grad(lp, old, ref, adv, mask):  # type: ignore[no-untyped-def]
    """The same loss and its gradient as one elementwise expression and two masked sums.

    Follows verl's branches: the ratio's derivative is zero where the log ratio is clamped;
    the clipped term carries a gradient only inside its band; the dual-clip constant carries
    none; k3's derivative is zero where either of its clamps is active.
    """
    n = jnp.sum(mask, dtype=jnp.float32)
    d = lp - old
    dc = jnp.clip(d, -20.0, 20.0)
    r = jnp.exp(dc)
    dr = jnp.where((d > -20.0) & (d < 20.0), r, 0.0)
    l1 = -adv * r
    rc = jnp.clip(r, 1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
    l2 = -adv * rc
    use2 = l2 > l1
    m = jnp.maximum(l1, l2)
    g_m = jnp.where(use2, jnp.where((r > 1.0 - CLIP_LOW) & (r < 1.0 + CLIP_HIGH), -adv, 0.0), -adv)
    l3 = -adv * CLIP_C
    dual = (adv < 0) & (m > l3)
    pg = jnp.where(dual, l3, m)
    g_pg = jnp.where(dual, 0.0, g_m) * dr
    kl = ref - lp
    klc = jnp.clip(kl, -20.0, 20.0)
    e = jnp.exp(klc)
    k = e - klc - 1.0
    kout = jnp.clip(k, -10.0, 10.0)
    g_k = jnp.where((k < 10.0) & (kl > -20.0) & (kl < 20.0), 1.0 - e, 0.0)
    inv_n = 1.0 / n
    loss = jnp.sum(jnp.where(mask, pg + KL_COEF * kout, 0.0)) * inv_n
    grad = jnp.where(mask, (g_pg + KL_COEF * g_k) * inv_n, 0.0)
    return loss, grad


def time_jax(fn: Callable, args: tuple, repeats: int) -> tuple[float, list[float], tuple]:
    """Median seconds of a compiled call, after compiling and warming it up."""
    out = jax.block_until_ready(fn(*args))
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, out


def copy_bandwidth(repeats: int, nbytes: int = 256 * 2**20) -> float:
    """Bytes per second of a large float32 array copy, counting the read and the write."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(5, repeats // 3)):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)


def run_verl(inputs: dict[str, np.ndarray], repeats: int) -> dict:
    """verl's eager step in the reference venv, on the same arrays."""
    python = subprocess.run(
        ["bash", str(ROOT / "tools" / "reference_env.sh")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inputs.npz")
        np.savez(
            path,
            **inputs,
            clip_low=np.float64(CLIP_LOW),
            clip_high=np.float64(CLIP_HIGH),
            clip_c=np.float64(CLIP_C),
        )
        done = subprocess.run(
            [python, str(Path(__file__).with_name("verl_grpo_step.py")), path, str(repeats),
             str(KL_COEF)],
            check=True,
            capture_output=True,
            text=True,
        )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", default="32x512,256x2048")
    parser.add_argument("--no-dew", action="store_true", help="skip the dew.rl composition")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    bandwidth = copy_bandwidth(args.repeats)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs")
    print(f"large-array copy bandwidth: {bandwidth / 1e9:.2f} GB/s (read + write)")
    dew_step = jax.jit(jax.value_and_grad(dew_loss))
    fused_step = jax.jit(fused_value_and_grad)
    rows = []
    for b, t in sizes:
        inputs = make_inputs(b, t)
        args_j = tuple(
            jax.device_put(inputs[k])
            for k in ("log_prob", "old_log_prob", "ref_log_prob", "advantages", "response_mask")
        )
        verl = run_verl(inputs, args.repeats)
        floor = b * t * BYTES_PER_TOKEN / bandwidth
        results = {"verl": (verl["median_s"], verl["loss"], verl["grad_abs_sum"])}
        impls = [("fused", fused_step)] if args.no_dew else [("dew.rl", dew_step), ("fused", fused_step)]
        for name, fn in impls:
            med, _, (loss, grad) = time_jax(fn, args_j, args.repeats)
            results[name] = (med, float(loss), float(jnp.abs(grad).sum()))
        print(f"\n[{b}, {t}] float32, {b * t} tokens, floor {floor * 1e6:.0f} us "
              f"({b * t * BYTES_PER_TOKEN / 2**20:.1f} MiB moved); verl torch threads "
              f"{verl['threads']}")  # fmt: skip
        for name, (med, loss, gsum) in results.items():
            ratio = results["verl"][0] / med
            print(
                f"  {name:7s} median {med * 1e3:9.3f} ms  verl/this {ratio:7.1f}x  "
                f"floor fraction {floor / med:6.3f}  loss {loss:.7f}  |grad|_1 {gsum:.6f}"
            )
        rows.append({"shape": [b, t], **{k: v[0] for k, v in results.items()}})
    print("\n" + json.dumps({"bandwidth_Bps": bandwidth, "rows": rows}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Benchmark a GRPO-style loss step of dew.rl under jax.jit against verl 0.9.1 eager torch.

The step: token log ratio, dual-clipped surrogate (eps 0.2 / 0.28, dual clip 3.0), k3 KL to a
reference policy with coefficient 0.04, token-mean reduction; forward and backward to the
policy log-probabilities, float32 [B, T] inputs. Implementations, on the same inputs:

- ``dew.rl``: the library path, ``rl.policy_loss`` (the surrogate and the KL with their
  derivative written out in one elementwise pass), ``jax.jit(jax.value_and_grad(...))``;
- ``compose``: the same loss as the composition of the per-term dew.rl functions
  (``token_log_ratio``, ``clipped_surrogate``, ``k3_kl``, ``token_mean``);
- ``dew+remat``: the composition under ``jax.checkpoint``, so the backward pass
  recomputes the exponentials from the inputs instead of reading stored copies;
- ``fused``: the same loss and its derivative written by hand as two elementwise passes
  (see :func:`fused_value_and_grad`), to show what one jitted step can reach; it is not the
  library's code path;
- ``verl``: verl's compute_policy_loss_vanilla + kl_penalty(k3) + agg_loss with autograd, in
  eager torch, in a worker process under the reference venv (tools/reference_env.sh).

The runs are interleaved in rounds by tools/bench/_rounds.py (verl, each jax implementation
and the copy that measures the memory floor, the order rotating each round), both sides
pinned to the same CPUs with the same thread count; a round's value is the median of
``--repeats`` runs. Printed per contender: median and spread (min-max) of wall-clock and
process CPU time; ratios of medians verl / jax with the spread of the per-round ratios (CPU
time does not count the time a process waits for a core, so on a loaded machine it is the
ratio load moves least). The memory floor of a step is the bytes it must move (read four
float32 inputs and the bool mask, write the float32 gradient: 21 bytes a token) over the
same round's copy bandwidth (a 256 MiB copy, read + write), and "floor fraction" is that
floor over the step's time (goal >= 0.5 at [256, 2048]); the library path is compared with
the hand-fused one (goal: within 10%).

The step is not only memory: each token also costs two exponentials and about a hundred
elementwise operations. The "compute floor" contender runs the loss and its derivative once
(``_terms_and_grad``, the least arithmetic any implementation must do) over a 4096-token
tile that stays in cache, repeated until it has covered the same number of tokens, so it
measures the arithmetic alone at this round's speed. The floor a step can reach is the larger
of the two floors ("floor fraction (max floor / time)"), and XLA's own count of the compiled
step's operations (flops, transcendentals and bytes accessed per token, from
``cost_analysis``) is printed beside it. Record: tools/bench/results/rl.json.

``--no-verl`` leaves the verl worker out (no reference venv needed): the jax contenders and
the floor are timed alone, no verl ratio is printed, and the record goes to
tools/bench/results/rl_no_verl.json.

Usage: .venv/bin/python tools/bench/bench_rl.py [--rounds 5] [--repeats 20]
       [--sizes 32x512,256x2048] [--threads N] [--cpus 0] [--no-verl]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402  (imported after the harness module; Bench sets the flags before use)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _rounds import Bench, Worker, add_arguments, reference_python  # noqa: E402

GOAL_FLOOR, GOAL_FUSED = 0.5, 0.9
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


def library_loss(lp: jax.Array, old: jax.Array, ref: jax.Array, adv: jax.Array, mask: jax.Array):
    """The GRPO-style loss through the library's fused path, ``rl.policy_loss``."""
    from dew import rl

    loss, _ = rl.policy_loss(lp, old, adv, mask, ref, CLIP_LOW, CLIP_HIGH, CLIP_C, KL_COEF)
    return loss


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


TILE = 4096  # tokens of the compute floor's cache-resident tile (5 inputs: 80 KiB)


def compute_floor_fn(tokens: int) -> tuple[Callable, tuple]:
    """A jitted pass of the loss arithmetic over ``tokens`` tokens, read from one cached tile.

    ``tokens // TILE`` iterations of ``_terms_and_grad`` on the same [1, TILE] inputs. The
    log-probabilities are shifted by the previous iteration's sum times 1e-30 (a value that
    leaves them unchanged in float32 but that XLA cannot know), so no iteration can be hoisted
    out of the loop or merged with another; the sums keep every result live.
    """
    tile = make_inputs(1, TILE, seed=1)
    args = tuple(jax.device_put(tile[k]) for k in ARG_ORDER)
    reps = max(1, tokens // TILE)

    def run(lp, old, ref, adv, mask):  # type: ignore[no-untyped-def]
        def body(i, acc):  # type: ignore[no-untyped-def]
            shifted = lp + acc * 1e-30
            terms, grad = _terms_and_grad(shifted, old, ref, adv, mask, 1.0 / TILE)
            return acc + jnp.sum(terms) + jnp.sum(grad)

        return jax.lax.fori_loop(0, reps, body, jnp.float32(0.0))

    return jax.jit(run), args


def op_counts(fn: Callable, args: tuple, tokens: int) -> dict[str, float]:
    """XLA's count for the compiled ``fn``: flops, transcendentals and bytes per token."""
    cost = fn.lower(*args).compile().cost_analysis()  # type: ignore[attr-defined]
    cost = cost[0] if isinstance(cost, list) else cost
    keys = {"flops": "flops", "transcendentals": "transcendentals", "bytes": "bytes accessed"}
    return {name: float(cost.get(key, 0.0)) / tokens for name, key in keys.items()}


def copy_seconds(src: np.ndarray, dst: np.ndarray, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times


def time_calls(fn: Callable, args: tuple, repeats: int) -> dict[str, list[float]]:
    """Wall-clock and process CPU seconds of ``repeats`` calls."""
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        cpu.append(time.process_time() - start_cpu)
        times.append(time.perf_counter() - start)
    return {"wall": times, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--repeats", type=int, default=20, help="runs per round")
    parser.add_argument("--sizes", default="32x512,256x2048")
    parser.add_argument("--no-verl", action="store_true", help="time the jax side only")
    args = parser.parse_args()
    # A run without verl is recorded apart, so it never replaces the record with verl.
    bench = Bench("rl_no_verl" if args.no_verl else "rl", args.cpus, args.threads)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    src = np.ones(64 * 2**20, dtype=np.float32)  # 256 MiB: far past any cache here
    dst = np.empty_like(src)
    np.copyto(dst, src)
    impls: dict[str, Callable] = {
        "dew.rl": jax.jit(jax.value_and_grad(library_loss)),
        "compose": jax.jit(jax.value_and_grad(dew_loss)),
        "dew+remat": jax.jit(jax.value_and_grad(jax.checkpoint(dew_loss))),
        "fused": jax.jit(fused_value_and_grad),
    }
    worker = None
    side = "no verl worker (--no-verl)"
    if not args.no_verl:
        script = str(Path(__file__).with_name("verl_grpo_step.py"))
        worker = Worker([reference_python(), script, str(bench.threads)])
        side = f"verl worker torch {worker.info['torch']} with {worker.info['threads']} threads"
    bench.say(
        f"jax {jax.__version__} on {jax.devices()[0].platform}; {side}; {args.rounds} rounds x "
        f"{args.repeats} runs, interleaved; a round's value is the median of its runs"
    )
    others = () if worker is None else ("verl",)
    checks_all: dict[str, dict] = {}
    counts_all: dict[str, dict] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for b, t in sizes:
                inputs = make_inputs(b, t)
                path = os.path.join(tmp, f"inputs_{b}x{t}.npz")
                np.savez(path, **inputs, clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                         clip_c=CLIP_C, kl_coef=KL_COEF)  # fmt: skip
                checks = {} if worker is None else {"verl": worker.ask(load=path)}
                jargs = tuple(jax.device_put(inputs[k]) for k in ARG_ORDER)
                for name, fn in impls.items():
                    loss, grad = jax.block_until_ready(fn(*jargs))  # compile and warm up
                    fn(*jargs)
                    checks[name] = {
                        "loss": float(loss),
                        "grad_abs_sum": float(jnp.sum(jnp.abs(grad))),
                    }
                moved = b * t * BYTES_PER_TOKEN
                arith, arith_args = compute_floor_fn(b * t)
                jax.block_until_ready(arith(*arith_args))  # compile outside the rounds
                counts = {name: op_counts(fn, jargs, b * t) for name, fn in impls.items()}
                counts_all[f"{b}x{t}"] = counts

                def floor(moved: int = moved) -> float:  # the bytes at this round's bandwidth
                    copies = copy_seconds(src, dst, max(3, args.repeats // 5))
                    return moved / (2 * src.nbytes / statistics.median(copies))

                def verl() -> dict[str, list[float]]:
                    assert worker is not None
                    got = worker.ask(time=args.repeats)
                    return {"wall": got["times_s"], "cpu": got["cpu_s"]}

                contenders: dict[str, Callable] = {
                    "floor": floor,
                    "compute floor": lambda f=arith, a=arith_args: time_calls(f, a, args.repeats),
                }
                if worker is not None:
                    contenders["verl"] = verl
                for name, fn in impls.items():
                    contenders[name] = lambda fn=fn, a=jargs: time_calls(fn, a, args.repeats)
                times = bench.rounds(contenders, args.rounds, group=f"{b}x{t}", verbose=False)
                bench.say(f"\n[{b}, {t}] float32, {b * t} tokens, {moved / 2**20:.1f} MiB to move")
                bench.show("memory floor (copy bandwidth)", times["floor"], 1e6, " us", 0)
                bench.show("compute floor (one pass, cached)", times["compute floor wall"],
                           1e6, " us", 0)  # fmt: skip
                both = [max(m, c) for m, c in zip(times["floor"], times["compute floor wall"])]
                for name, count in counts.items():
                    bench.say(f"  XLA count {name:9s} per token: {count['flops']:.0f} flops, "
                              f"{count['transcendentals']:.0f} transcendentals, "
                              f"{count['bytes']:.1f} bytes accessed")  # fmt: skip
                for name in (*others, *impls):
                    bench.show(f"{name} wall", times[f"{name} wall"], 1e6, " us", 0)
                    bench.show(f"{name} cpu", times[f"{name} cpu"], 1e6, " us", 0)
                for name in impls:
                    if worker is not None:
                        bench.compare(
                            f"verl / {name} (wall)", times["verl wall"], times[f"{name} wall"]
                        )
                        bench.compare(f"verl / {name} (cpu time)", times["verl cpu"],
                                      times[f"{name} cpu"])  # fmt: skip
                    goal = GOAL_FLOOR if (b, t) == (256, 2048) else None
                    bench.compare(f"{name} floor fraction (floor / time)", times["floor"],
                                  times[f"{name} wall"], goal)  # fmt: skip
                    bench.compare(f"{name} floor fraction (max floor / time)", both,
                                  times[f"{name} wall"], goal)  # fmt: skip
                bench.compare("library path vs hand-fused (fused / dew.rl time)",
                              times["fused wall"], times["dew.rl wall"], GOAL_FUSED)  # fmt: skip
                bench.compare("composition vs hand-fused (fused / compose time)",
                              times["fused wall"], times["compose wall"])  # fmt: skip
                for name, check in checks.items():
                    bench.say(
                        f"  check {name:9s} loss {check['loss']:+.7f} "
                        f"|grad|_1 {check['grad_abs_sum']:.6f}"
                    )
                checks_all[f"{b}x{t}"] = checks
    finally:
        if worker is not None:
            worker.close()
    bench.finish({"args": vars(args), "checks": checks_all, "op_counts": counts_all})


if __name__ == "__main__":
    main()

"""The matrix products of a compiled program, timed outside it at the shapes its HLO names.

``profile_step.parse_hlo`` lists each product instruction's dots (operand dtypes and shapes,
dimension numbers); here they run as plain ``lax.dot_general`` calls on random operands,
either one shape at a time in a loop of its own (``isolated_products``: the operands stay in
the CPU's caches) or all of a step's products in one loop (``products_together``: each
instance on its own operands, so they stream from wherever the step's working set lives).
Used by ``profile_step.py`` and ``profile_decode.py`` to bound what the products alone allow.
"""

from __future__ import annotations

import collections
import json
import math
import time


def _timeable(entry: dict | None) -> bool:
    """Whether an instruction is a product whose dots' operand shapes are all known."""
    if not entry or not entry["matmul"] or not entry["dots"]:
        return False
    return all(d["lhs"] is not None and d["rhs"] is not None for d in entry["dots"])


def isolated_products(info: dict, times: dict[str, float], runs: dict[str, float],
                      repeats: int = 5) -> dict:  # fmt: skip
    """The step's matrix products timed alone: every traced product instruction's dots run
    as one jitted ``lax.dot_general`` at the same operand shapes, dtypes and dimension
    numbers (best of ``repeats``), times its runs per step. What the products cost at
    XLA's own rate for these shapes, with no fusion around them: the ceiling the step's
    products can reach without changing their shapes. Also their FLOPs, from the shapes."""
    import jax
    import numpy as np

    cache: dict[str, tuple[float, float]] = {}
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for name, seconds in times.items():
        entry = info.get(name)
        if not _timeable(entry):
            continue
        assert entry is not None
        keys = [json.dumps(d) for d in entry["dots"]]
        for key, spec in zip(keys, entry["dots"]):
            if key not in cache:
                cache[key] = _time_dot(jax, np, spec, repeats)
        row = rows[" + ".join(_label(d) for d in entry["dots"])]
        row[0] += seconds
        row[1] += sum(cache[k][0] for k in keys) * runs[name]
        row[2] += sum(cache[k][1] for k in keys) * runs[name]
    alone, in_step, flops = (sum(r[i] for r in rows.values()) for i in (1, 0, 2))
    table = sorted(([label, *row] for label, row in rows.items()), key=lambda r: -r[1])
    return {"alone_s": alone, "in_step_s": in_step, "flops": flops, "shapes": len(cache),
            "by_shape": table}  # fmt: skip


def products_together(info: dict, times: dict[str, float], runs: dict[str, float],
                      repeats: int = 3, inner: int = 4) -> dict:  # fmt: skip
    """The step's matrix products run together and nothing else: one compiled loop whose
    turn runs every traced product instruction's dots (each as often per step as the trace
    ran it, rounded), each instance on operands of its own, so between two runs of a
    product the loop reads every other product's operands, as the step reads each layer's
    weights in turn. Unlike ``isolated_products``, whose operands stay in the CPU's caches,
    this is what the products cost when their operands come from wherever the step's
    working set puts them: the step's time with every other operation removed. Two ways it
    departs from the step: each turn scales every left operand by a carried 1.0 (one
    elementwise pass each, see ``_time_dot``: slightly pessimistic), and the turn's dots do
    not depend on each other, so with more than one thread XLA may run them side by side
    where the step runs most of them one after another (optimistic: a bound, not a
    forecast). Returns ``together_s`` per step (best of ``repeats`` loops of ``inner``
    turns), the FLOPs and the in-step seconds of the same instructions, and ``products``
    (how many dots a turn runs)."""
    import jax
    import numpy as np

    specs: list[dict] = []
    in_step = 0.0
    for name, seconds in times.items():
        entry = info.get(name)
        if not _timeable(entry) or round(runs[name]) < 1:
            continue
        assert entry is not None
        specs.extend(entry["dots"] * round(runs[name]))
        in_step += seconds
    if not specs:
        return {"together_s": 0.0, "flops": 0.0, "in_step_s": 0.0, "products": 0}
    turn_s, outs = _timed_loop(jax, np, specs, repeats, inner)
    flops = sum(2.0 * out.size * _contracted(s) for out, s in zip(outs, specs))
    return {"together_s": turn_s, "flops": flops, "in_step_s": in_step,
            "products": len(specs)}  # fmt: skip


def _numbers(dims: dict) -> tuple:
    """``lax.dot_general`` dimension numbers from an HLO dot's attributes."""
    return ((dims.get("lhs_contracting_dims", ()), dims.get("rhs_contracting_dims", ())),
            (dims.get("lhs_batch_dims", ()), dims.get("rhs_batch_dims", ())))  # fmt: skip


def _contracted(spec: dict) -> int:
    """How many products of elements one output element of the dot sums."""
    shape = spec["lhs"][1]
    return int(math.prod(shape[i] for i in spec["dims"].get("lhs_contracting_dims", ())))


def _operand(jax, rng, dtype: str, shape: list[int]):  # type: ignore[no-untyped-def]
    """A random array of an HLO dtype (``f32``, ``bf16``) and shape."""
    name = dtype.replace("bf", "bfloat").replace("f32", "float32")
    return jax.numpy.asarray(rng.standard_normal(shape, dtype="float32"), name)


def _label(spec: dict) -> str:
    """``[M,K]x[K,N]``-style label of a dot: operand shapes, contracted dims marked ``'``."""
    dims = spec["dims"]
    parts = []
    for side in ("lhs", "rhs"):
        contracted = dims.get(f"{side}_contracting_dims", ())
        shape = spec[side][1]
        parts.append("[" + ",".join(f"{n}'" if i in contracted else str(n)
                                    for i, n in enumerate(shape)) + "]")  # fmt: skip
    return "x".join(parts)


def _time_dot(jax, np, spec: dict, repeats: int, inner: int = 16) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Best seconds of one dot at ``spec``'s shapes, and its FLOPs.

    The dot runs ``inner`` times in one compiled loop, so a small product's time is not the
    host's dispatch of a call; each turn scales the left operand by a carried 1.0, so the
    product cannot be hoisted out of the loop (the scaling is one elementwise pass over
    the left operand, small beside the product it feeds). The operands stay in the CPU's
    caches from turn to turn: for operands that fit there (a decode step's weights) this
    is the warm-cache time, below what the product costs in a program that reads other
    weights between its runs."""
    seconds, (out,) = _timed_loop(jax, np, [spec], repeats, inner)
    return seconds, 2.0 * out.size * _contracted(spec)


def _timed_loop(jax, np, specs: list[dict], repeats: int, inner: int) -> tuple[float, tuple]:  # type: ignore[no-untyped-def]
    """Best seconds of one turn running every dot of ``specs`` on random operands of its own,
    and the dots' outputs. One compiled loop of ``inner`` turns after a first one; each turn
    scales every left operand by a carried 1.0 that the outputs feed back (times 0), so no
    product is hoisted out of the loop."""
    rng = np.random.default_rng(0)
    operands = [(_operand(jax, rng, *s["lhs"]), _operand(jax, rng, *s["rhs"])) for s in specs]
    numbers = [_numbers(s["dims"]) for s in specs]

    def loop(pairs):  # type: ignore[no-untyped-def]
        def turn(_, carry):  # type: ignore[no-untyped-def]
            scale, _ = carry
            outs = tuple(jax.lax.dot_general(a * scale.astype(a.dtype), b, n)
                         for (a, b), n in zip(pairs, numbers))  # fmt: skip
            touch = sum(out.reshape(-1)[0].astype(scale.dtype) for out in outs)
            return scale + 0 * touch, outs

        first = tuple(jax.lax.dot_general(a, b, n) for (a, b), n in zip(pairs, numbers))
        return jax.lax.fori_loop(0, inner, turn, (jax.numpy.ones((), "float32"), first))[1]

    run = jax.jit(loop)
    outs = jax.block_until_ready(run(operands))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(operands))
        best = min(best, time.perf_counter() - start)
    return best / (inner + 1), outs

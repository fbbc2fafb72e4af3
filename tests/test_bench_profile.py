"""The profilers' product timing (``tools/bench/_products.py``): the dots at the shapes a
compiled program's HLO names, run in compiled loops, one shape alone or a step's products
together (loaded from its file: the benches are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("_products", BENCH / "_products.py")
assert spec is not None and spec.loader is not None
products = importlib.util.module_from_spec(spec)
spec.loader.exec_module(products)


def test_a_dot_is_timed_per_turn_with_its_flops():
    import jax
    import numpy as np

    dot = {
        "lhs": ("f32", [2, 8, 16]),
        "rhs": ("f32", [2, 16, 4]),
        "dims": {
            "lhs_batch_dims": (0,),
            "rhs_batch_dims": (0,),
            "lhs_contracting_dims": (2,),
            "rhs_contracting_dims": (1,),
        },
    }
    seconds, flops = products._time_dot(jax, np, dot, repeats=2, inner=3)
    assert flops == 2.0 * (2 * 8 * 4) * 16
    assert math.isfinite(seconds) and seconds > 0
    assert products._label(dot) == "[2,8,16']x[2,16',4]"


def test_a_steps_products_run_together_each_instance_counted():
    square = {"lhs": ("f32", [8, 16]), "rhs": ("f32", [16, 4]),
              "dims": {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}}  # fmt: skip
    half = {"lhs": ("bf16", [4, 8]), "rhs": ("bf16", [8, 2]),
            "dims": {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}}  # fmt: skip
    unknown = {"lhs": None, "rhs": ("f32", [8, 2]), "dims": {}}
    info = {
        "fusion.1": {"matmul": True, "dots": [square]},
        "dot.2": {"matmul": True, "dots": [half]},
        "fusion.3": {"matmul": False, "dots": []},
        "dot.4": {"matmul": True, "dots": [unknown]},
        "dot.5": {"matmul": True, "dots": [square]},
    }
    times = {"fusion.1": 0.5, "dot.2": 0.25, "fusion.3": 1.0, "dot.4": 2.0, "dot.5": 4.0}
    runs = {"fusion.1": 2.0, "dot.2": 1.0, "fusion.3": 1.0, "dot.4": 1.0, "dot.5": 0.2}

    out = products.products_together(info, times, runs, repeats=1, inner=2)

    # fusion.1 twice a step, dot.2 once; the non-product, the unknown shape and the product
    # that runs once in five steps are left out.
    assert out["products"] == 3
    assert out["flops"] == 2 * (2.0 * 8 * 4 * 16) + 2.0 * 4 * 2 * 8
    assert out["in_step_s"] == 0.75
    assert math.isfinite(out["together_s"]) and out["together_s"] > 0


def test_nothing_to_run_together_is_zero_work():
    out = products.products_together({"add.1": {"matmul": False, "dots": []}}, {"add.1": 1.0},
                                     {"add.1": 1.0})  # fmt: skip
    assert out == {"together_s": 0.0, "flops": 0.0, "in_step_s": 0.0, "products": 0}


def test_the_prefill_shape_is_rows_by_length():
    import argparse

    import pytest

    spec = importlib.util.spec_from_file_location("profile_decode", BENCH / "profile_decode.py")
    assert spec is not None and spec.loader is not None
    decode = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode)
    assert decode.rows_by_length("8x512") == (8, 512)
    for bad in ("8", "8x", "0x512", "8x512x2", "ax512"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected ROWSxLENGTH"):
            decode.rows_by_length(bad)

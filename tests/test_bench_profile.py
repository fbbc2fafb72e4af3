"""The profilers' product timing (``tools/bench/profile_step.py``): one dot at the shapes a
compiled program's HLO names, run in a compiled loop (loaded from its file: the benches are
scripts, not a package)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("profile_step", BENCH / "profile_step.py")
assert spec is not None and spec.loader is not None
profile_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_step)


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
    seconds, flops = profile_step._time_dot(jax, np, dot, repeats=2, inner=3)
    assert flops == 2.0 * (2 * 8 * 4) * 16
    assert math.isfinite(seconds) and seconds > 0
    assert profile_step._label(dot) == "[2,8,16']x[2,16',4]"

"""The benchmark harness's statistics, goal rule, round order and record (pure Python, fast).

``tools/bench/_rounds.py`` is loaded from its file: the benches are scripts, not a package.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "tools" / "bench" / "_rounds.py"
spec = importlib.util.spec_from_file_location("_rounds", PATH)
assert spec is not None and spec.loader is not None
rounds = importlib.util.module_from_spec(spec)
sys.modules.setdefault("_rounds", rounds)  # dataclasses look their module up
spec.loader.exec_module(rounds)


def _bench(name: str):  # type: ignore[no-untyped-def]
    """Another script of ``tools/bench``, loaded from its file."""
    found = importlib.util.spec_from_file_location(name, PATH.parent / f"{name}.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def test_spread_is_median_and_min_max():
    s = rounds.spread([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.count) == (2.5, 1.0, 10.0, 4)
    assert s.text(1e3, " ms", 0) == "2500 ms (1000-10000)"


def test_spread_refuses_an_empty_list():
    with pytest.raises(ValueError, match="at least one value, got an empty list"):
        rounds.spread([])


def test_ratio_of_medians_with_per_round_spread():
    peer = [2.0, 4.0, 3.0]  # seconds, peer slower
    ours = [1.0, 1.0, 2.0]
    r = rounds.ratio("peer/ours", peer, ours, goal=1.2)
    assert r.value == pytest.approx(3.0 / 1.0)
    assert (r.low, r.high) == (pytest.approx(1.5), pytest.approx(4.0))
    assert r.verdict == "met"


def test_goal_rule_met_not_met_not_shown():
    assert rounds.verdict(1.6, 2.0, 1.5) == "met"
    assert rounds.verdict(1.5, 2.0, 1.5) == "met"  # reaching the goal counts
    assert rounds.verdict(1.0, 1.4, 1.5) == "not met"
    assert rounds.verdict(1.2, 1.8, 1.5) == "not shown"
    assert rounds.verdict(1.2, 1.8, None) == "no goal"
    # a median above the goal is still "not shown" when one round falls below it
    r = rounds.ratio("x", [3.0, 3.0, 1.0], [1.0, 1.0, 1.0], goal=1.5)
    assert r.value == 3.0 and r.verdict == "not shown"
    assert "not shown" in r.text() and "3.00x" in r.text()


def test_ratio_refuses_unpaired_rounds():
    with pytest.raises(ValueError, match="one value per round on both sides, got 2 and 3"):
        rounds.ratio("x", [1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="denominator values must be > 0, got 0.0"):
        rounds.ratio("x", [1.0], [0.0])


def test_rounds_interleave_with_rotating_order_and_take_medians():
    calls: list[str] = []

    def make(name, value):
        def call():
            calls.append(name)
            return value

        return call

    out = rounds.run_rounds(
        {"a": make("a", 1.0), "b": make("b", [5.0, 1.0, 3.0]), "c": make("c", 2)}, 3
    )
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out == {"a": [1.0] * 3, "b": [3.0] * 3, "c": [2.0] * 3}


def test_a_contender_may_report_several_series():
    out = rounds.run_rounds({"ckpt": lambda: {"save": [1.0, 3.0], "restore": 2.0}}, 3)
    assert out == {"ckpt save": [2.0] * 3, "ckpt restore": [2.0] * 3}


def test_rounds_refuse_fewer_than_three():
    with pytest.raises(ValueError, match="rounds: expected at least 3, got 2"):
        rounds.run_rounds({"a": lambda: 1.0}, 2)


def test_thread_env_pins_xla_and_torch_alike(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4 "
                       "--xla_cpu_multi_thread_eigen=true")  # fmt: skip
    one = rounds.thread_env(1)
    assert one["DEW_BENCH_THREADS"] == one["OMP_NUM_THREADS"] == "1"
    assert one["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=4",
                                        "--xla_cpu_multi_thread_eigen=false"]  # fmt: skip
    two = rounds.thread_env(2)
    assert two["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert two["DEW_BENCH_THREADS"] == two["MKL_NUM_THREADS"] == "2"


def test_parse_cpus():
    assert rounds.parse_cpus("0,2-3") == {0, 2, 3}
    with pytest.raises(ValueError, match="--cpus: expected ids like 0,1 or 0-3, got 'a'"):
        rounds.parse_cpus("a")


def test_record_is_written_atomically_with_the_machine(tmp_path):
    info = rounds.cpu_info()
    assert {"cpu_model", "flags", "amx", "avx512", "cores", "affinity"} <= set(info)
    path = rounds.write_record("unit", {"machine": info, "x": [1, 2]}, tmp_path)
    assert json.loads(path.read_text())["x"] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["unit.json"]


def test_model_arguments_are_defined_once_for_the_model_benches():
    import argparse

    shapes = _bench("_shapes")
    parser = argparse.ArgumentParser()
    shapes.add_model_arguments(parser)
    args = parser.parse_args(["--shape", "qwen3-0.6b", "--dtype", "bfloat16"])
    assert (args.shape, args.dtype) == ("qwen3-0.6b", "bfloat16")
    assert shapes.SHAPES[args.shape]["hidden_size"] == 1024
    assert parser.parse_args([]).shape == "small"
    with pytest.raises(SystemExit):
        parser.parse_args(["--shape", "huge"])
    for bench in ("bench_sft.py", "bench_generation.py"):
        text = (PATH.parent / bench).read_text()
        assert "add_model_arguments(parser)" in text and "SHAPES = {" not in text


def test_device_argument_is_defined_once():
    import argparse

    parser = argparse.ArgumentParser()
    rounds.add_device_argument(parser)
    assert parser.parse_args(["--device", "cuda"]).device == "cuda"
    assert parser.parse_args([]).device == "cpu"
    for bench in ("_shapes.py", "bench_first_step.py"):
        text = (PATH.parent / bench).read_text()
        assert "add_device_argument(parser)" in text and '"--device"' not in text


def test_mfu_is_flops_over_time_over_the_peak():
    assert rounds.mfu(2e12, 0.5, 8.0) == pytest.approx(0.5)
    assert rounds.mfu(2e12, 0.5, 0.0) is None
    assert rounds.mfu_text(2e12, 0.5, 8.0) == "  MFU 0.500"
    assert rounds.mfu_text(2e12, 0.5, 0.0) == ""


def test_prefill_flops_count_the_head_where_each_side_runs_it():
    generation = _bench("bench_generation")
    cfg = {"vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 2,
           "num_attention_heads": 3, "head_dim": 5}  # fmt: skip
    params, b, t = 100, 2, 6  # 40 of the 100 are the tied head (vocab x width)
    attention = 2 * 2 * 3 * 5 * t * (b * t)
    every = generation.prefill_flops(params, cfg, b, t)
    last = generation.prefill_flops(params, cfg, b, t, head_tokens=b)
    assert every == 2.0 * params * b * t + attention
    assert last == 2.0 * 60 * b * t + 2.0 * 40 * b + attention


def test_first_step_names_the_slowest_compiles_by_their_median():
    first = _bench("bench_first_step")
    runs = [{"jit(step)": 2.0, "jit(init)": 1.0}, {"jit(step)": 1.8, "jit(a)": 0.1},
            {"jit(step)": 1.9, "jit(init)": 1.2}]  # fmt: skip
    assert first.slowest_programs(runs) == "jit(step) 1.90 s, jit(init) 1.00 s, jit(a) 0.00 s"
    assert first.slowest_programs(runs, most=1) == "jit(step) 1.90 s"
    assert "CHILD" in dir(first) and "backend_compile_duration" in first.CHILD

"""JAX's persistent compilation cache as Dew sets it up (``dew.compile_cache``).

Two real ``dew train lm`` processes share a temporary cache: the first writes entries and
finds none, the second finds every program (JAX's ``cache_hits`` monitoring events, counted
in the child) and writes nothing new, and both export bit-identical weights, so a cached
executable trains exactly as a fresh compile. Every process-wide choice (off, the user's own
JAX directory) is checked in a child process, since JAX opens its cache once per process;
the suite itself runs with ``DEW_COMPILE_CACHE=0`` (the workspace's ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dew import compile_cache

#: Runs the ``dew`` command line in this process and prints its status and JAX's cache events.
TRAIN = """
import json, sys
from jax import monitoring
counts = {}
monitoring.register_event_listener(
    lambda name, **kw: counts.__setitem__(name, counts.get(name, 0) + 1))
from dew.cli import main
status = main(sys.argv[1:])
print("RESULT " + json.dumps({"status": status,
      "hits": counts.get("/jax/compilation_cache/cache_hits", 0),
      "misses": counts.get("/jax/compilation_cache/cache_misses", 0)}))
"""
#: Configures the cache as a library user would, compiles one program, prints what JAX holds.
PROBE = """
import json, jax, jax.numpy as jnp
from dew.compile_cache import configure
chosen = configure()
jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).block_until_ready()
print("RESULT " + json.dumps({"chosen": chosen,
      "enabled": jax.config.jax_enable_compilation_cache,
      "dir": jax.config.jax_compilation_cache_dir,
      "min_seconds": jax.config.jax_persistent_cache_min_compile_time_secs}))
"""


def _start(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> Any:
    ambient = ("XLA_FLAGS", "DEW_COMPILE_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")
    environment = {k: v for k, v in os.environ.items() if k not in ambient}
    environment.update({"JAX_PLATFORMS": "cpu", **(env or {})})
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _result(process: Any) -> dict:
    out, err = process.communicate(timeout=300)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0 and lines, out[-2000:] + err[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _run(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> dict:
    return _result(_start(code, *args, cwd=cwd, env=env))


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """PROBE under three environments, run side by side: off, the default, a JAX-set dir."""
    cases: dict[str, dict[str, str]] = {"off": {"DEW_COMPILE_CACHE": "0"},
                                        "default": {"DEW_COMPILE_CACHE": ""},
                                        "jax_dir": {"DEW_COMPILE_CACHE": "1"}}  # fmt: skip
    started = {}
    for name, env in cases.items():
        work = tmp_path_factory.mktemp(name)
        env = {**env, "XDG_CACHE_HOME": str(work / "xdg")}
        if name != "default":  # the default case finds no directory but XDG's
            env["DEW_COMPILE_CACHE_DIR"] = str(work / "c")
        if name == "jax_dir":
            env["JAX_COMPILATION_CACHE_DIR"] = str(work / "mine")
        started[name] = (work, _start(PROBE, cwd=work, env=env))
    return {name: (work, _result(process)) for name, (work, process) in started.items()}


def _entries(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same ``dew train lm`` twice against one fresh cache directory."""
    work = tmp_path_factory.mktemp("cache_runs")
    np.save(work / "tokens.npy", (np.arange(4000) % 7).astype(np.uint16))
    out: dict = {"work": work, "cache": work / "cache"}
    for run in (1, 2):
        result = _run(TRAIN, "train", "lm", "--tokens", "tokens.npy", "--run-dir", f"run{run}",
                      "--steps", "3", "--batch", "2", "--seq-len", "16", "--emb-features", "32",
                      "--layers", "1", "--heads", "2", "--log-every", "1", "--export",
                      f"export{run}", "--export-dtype", "float32", "--compile-cache",
                      "--compile-cache-dir", "cache", cwd=work)  # fmt: skip
        out[run] = {**result, "entries": _entries(out["cache"])}
    return out


def test_the_first_run_writes_entries_the_second_finds_them(two_runs: dict) -> None:
    first, second = two_runs[1], two_runs[2]
    assert first["status"] == 0 and second["status"] == 0
    assert first["hits"] == 0 and first["misses"] > 0
    assert len(first["entries"]) > 0
    # the cache lives under one directory per host CPU kind
    assert {Path(e).parts[0] for e in first["entries"]} == {compile_cache.machine_tag()}
    assert second["hits"] >= first["misses"] and second["misses"] == 0
    assert second["entries"] == first["entries"]  # nothing new to write


def test_a_cache_hit_trains_bit_identically_to_a_fresh_compile(two_runs: dict) -> None:
    work = two_runs["work"]
    fresh = (work / "export1" / "model.safetensors").read_bytes()
    cached = (work / "export2" / "model.safetensors").read_bytes()
    assert fresh == cached

    def losses(run: int) -> list[float]:
        lines = (work / f"run{run}" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"loss"' in line]

    assert len(losses(1)) == 3 and losses(1) == losses(2)


def test_off_writes_nothing(probes: dict) -> None:
    work, got = probes["off"]
    assert got["chosen"] is None and got["enabled"] is False
    assert not (work / "c").exists() and not (work / "xdg").exists()


def test_on_by_default_under_xdg_and_small_programs_cached(probes: dict) -> None:
    work, got = probes["default"]
    root = work / "xdg" / "dew" / "jax"
    assert got["chosen"] == got["dir"] == str(root / compile_cache.machine_tag())
    assert got["min_seconds"] == 0.0
    assert _entries(root)  # a program compiled in well under a second was written


def test_a_directory_configured_through_jax_is_left_alone(probes: dict) -> None:
    work, got = probes["jax_dir"]
    assert got["chosen"] == got["dir"] == str(work / "mine")
    assert got["min_seconds"] == 1.0  # the user's thresholds too
    assert not (work / "c").exists()


def test_switch_and_directory_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for text, want in (("0", False), ("off", False), ("TRUE", True), ("", None)):
        monkeypatch.setenv("DEW_COMPILE_CACHE", text)
        assert compile_cache.switch_from_env() is want
    monkeypatch.setenv("DEW_COMPILE_CACHE", "maybe")
    with pytest.raises(ValueError, match=r"^DEW_COMPILE_CACHE: expected one of 1, .* got 'maybe'$"):
        compile_cache.switch_from_env()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_directory() == tmp_path / "dew" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # not absolute: ignored
    assert compile_cache.default_directory() == Path.home() / ".cache" / "dew" / "jax"
    with pytest.raises(TypeError, match="^enabled: expected True, False or None, got 'yes'$"):
        compile_cache.configure("yes")  # type: ignore[arg-type]


def test_the_flags_reach_the_run_config(tmp_path: Path) -> None:
    from dew.cli import build_parser, train_mapping
    from dew.recipes.train_config import train_config

    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.uint16))
    base = ["train", "lm", "--tokens", str(tmp_path / "t.npy"), "--run-dir", str(tmp_path / "r"),
            "--steps", "1"]  # fmt: skip
    for extra, want in (([], None), (["--no-compile-cache"], False), (["--compile-cache"], True)):
        args = build_parser().parse_args(base + extra)
        assert train_config(train_mapping(args), "lm").run.compile_cache is want
    args = build_parser().parse_args(base + ["--compile-cache-dir", str(tmp_path / "cc")])
    assert train_config(train_mapping(args), "lm").run.compile_cache_dir == str(tmp_path / "cc")

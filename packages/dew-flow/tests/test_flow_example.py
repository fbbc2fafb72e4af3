"""examples/flow_grpo.py (short settings) raises the red-pixel reward; dew quickstart --flow."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import zlib

import numpy as np
import pytest

from dew.flow import shapes
from dew.flow.quickstart import Settings

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "flow_grpo.py"


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR" and zlib.crc32(data[12:29]) == int.from_bytes(data[29:33], "big")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_shapes_and_reward() -> None:
    labels = np.arange(shapes.LABELS)
    images = shapes.make_shapes(labels, seed=0)
    assert images.shape == (6, 16, 16, 3) and images.dtype == np.uint8
    unit = images.astype(np.float64) / 127.5 - 1.0
    share = shapes.colour_fraction(unit, "red") + shapes.colour_fraction(unit, "green")
    share += shapes.colour_fraction(unit, "blue")
    painted = np.any(images != np.array(shapes.BACKGROUND, np.uint8), axis=-1).mean(axis=(1, 2))
    np.testing.assert_allclose(share, painted)  # every painted pixel has exactly one colour
    assert painted[1] > painted[0] and painted[3] > painted[2]  # large beats small
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 6\)"):
        shapes.make_shapes(np.array([6]), seed=0)
    with pytest.raises(ValueError, match="colour: expected one of"):
        shapes.colour_fraction(unit, "pink")


def test_example_raises_the_reward(tmp_path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--short", "--run-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mean red share before Flow-GRPO" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] and summary["updates"] == Settings.short().rl_steps
    assert summary["rl_reward_after"] > summary["rl_reward_before"] + 0.005, summary
    assert summary["held_out_reward_after"] > summary["held_out_reward_before"], summary
    width, height = _png_size(tmp_path / "grid.png")
    assert width > 8 * 16 * 3 and height > 4 * 16 * 3
    for stage in ("pretrain", "flow_grpo"):
        lines = (tmp_path / stage / "metrics.jsonl").read_text().splitlines()
        assert lines and "loss" in json.loads(lines[-1])


def test_dew_quickstart_flow_goes_through_the_entry_point(tmp_path, capsys) -> None:
    from dew.quickstart.command import main

    flow_dir = tmp_path / "flow"
    flow_dir.mkdir()
    settings = Settings(seed=3).scaled(0.5)
    summary = {
        "complete": True,
        "settings": dataclasses.asdict(settings),
        "held_out_reward_before": 0.01,
        "held_out_reward_after": 0.25,
        "grid": "grid.png",
    }
    (flow_dir / "summary.json").write_text(json.dumps(summary))
    argv = ["--flow", "--run-dir", str(tmp_path), "--seed", "3", "--steps", "0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "is complete; nothing to train" in out and "0.010 -> 0.250" in out

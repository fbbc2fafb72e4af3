"""``dew generate --canvas-steps``: a saved tiny decoder's completions by canvas generation
equal ``CanvasGeneration``'s for the same key, and bad canvas flags are refused in one line
with exit status 2."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.inference.canvas import Canvas, CanvasGeneration
from dew.models import load_pretrained
from dew.models.pretrained import Pretrained
from dew.sampling import Sampling
from dew.testing import tiny_decoder

PROMPTS = [[1, 2, 3], [4, 5]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("canvas_cli")
    model = tiny_decoder(12, 16, init_std=0.5)
    variables = model.init(jax.random.key(1), np.zeros((1, 4), np.int32))
    Pretrained.from_model(model, variables).save(base / "model", dtype="float32")
    (base / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return base


def test_cli_matches_canvas_generation(model_dir) -> None:
    out = model_dir / "out.jsonl"
    flags = ["--prompts", str(model_dir / "prompts.jsonl"), "--max-prompt-len", "4",
             "--max-new-tokens", "8", "--canvas-steps", "4", "--block-length", "4"]  # fmt: skip
    assert main(["generate", str(model_dir / "model"), *flags, "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    loaded = load_pretrained(model_dir / "model", dtype="float32")
    canvas = Canvas(mask_id=11, real_tokens=11, steps=4, block_length=4)
    gen = CanvasGeneration(loaded.model, loaded.variables, canvas=canvas)
    key = jax.random.fold_in(jax.random.key(0), 0)
    want = gen(PROMPTS, 8, key, Sampling(temperature=1.0))
    assert [r["row"] for r in records] == [0, 1]
    for record, expected in zip(records, want):
        assert record["ids"] == expected.ids.tolist() and record["length"] == 8
        assert record["finish_reason"] == "length" and 11 not in record["ids"]


def test_cli_refuses_bad_canvas_flags(model_dir, capsys) -> None:
    flags = ["--prompts", str(model_dir / "prompts.jsonl"), "--max-new-tokens", "8",
             "--canvas-steps", "3", "--block-length", "4"]  # fmt: skip
    assert main(["generate", str(model_dir / "model"), *flags]) == 2
    assert "steps: 3 is not divisible by the number of blocks 2" in capsys.readouterr().err

"""``dew train lm --objective block_diffusion --block-size N``: a run that learns, its config
key and the one-line errors of its options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dew.cli import main
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import train_config

TINY = ["--emb-features", "32", "--layers", "1", "--heads", "2", "--mlp-features", "64",
        "--batch", "16", "--seq-len", "16", "--no-progress"]  # fmt: skip


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.bin"
    np.tile(np.array([0, 1, 2], np.uint16), 512).tofile(path)  # ids 0..2, period 3
    return path


def lm(tokens, run_dir, *extra):
    return ["train", "lm", "--tokens", str(tokens), "--run-dir", str(run_dir), *TINY,
            "--objective", "block_diffusion", *extra]  # fmt: skip


def one_error(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_block_diffusion_run_learns_a_repeated_pattern(tokens, tmp_path):
    run_dir = tmp_path / "run"
    argv = lm(tokens, run_dir, "--block-size", "4", "--steps", "60", "--lr", "1e-2",
              "--log-every", "5", "--warmup", "0")  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    bits = [r["bits_per_token"] for r in records if "bits_per_token" in r]
    print("bits_per_token first/last:", bits[0], bits[-1])
    assert len(bits) >= 10 and all(np.isfinite(bits))
    # untrained: ~log2(4) bits per masked token; a clean earlier block or an unmasked
    # neighbour gives the pattern away, only a fully masked first block keeps ~log2(3)
    # (seen here: 1.56 -> 0.13 after 100 steps at batch 32, 1.7 -> 0.2-0.3 after 60 at 16)
    first, last = np.mean(bits[:2]), np.mean(bits[-3:])
    assert last < 0.5 * first, bits
    config = json.loads((run_dir / "config.json").read_text())
    assert config["objective"]["name"] == "block_diffusion"
    assert config["objective"]["block_size"] == 4
    assert config["model"]["vocab_size"] == 4  # ids 0..2 and the mask id 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--block-size", "5"],
         "dew: error: objective.block_size: expected a positive int dividing seq_len=16, "
         "got 5"),
        ([],
         "dew: error: objective.block_size: expected a positive integer (tokens per block) "
         "for block_diffusion, got None"),
        (["--block-size", "0"],
         "dew: error: objective.block_size: expected a positive integer (tokens per block) "
         "for block_diffusion, got 0"),
        (["--block-size", "4", "--noise-schedule", "cosine"],
         "dew: error: objective.noise_schedule: block_diffusion runs BD3-LM's loglinear "
         "schedule only, got 'cosine'"),
        (["--block-size", "4", "--objective", "next_token"],
         "dew: error: objective.block_size: only objective.name block_diffusion takes it, "
         "got objective.name next_token"),
        (["--block-size", "4", "--mask-rate-min", "0.9", "--mask-rate-max", "0.5"],
         "dew: error: objective.mask_rate_min: expected at most objective.mask_rate_max 0.5, "
         "got 0.9"),
        (["--block-size", "4", "--mask-rate-min", "0"],
         "dew: error: objective.mask_rate_min: expected a number in (0, 1], got 0.0"),
        (["--objective", "masked_diffusion", "--mask-rate-max", "0.8"],
         "dew: error: objective.mask_rate_max: only objective.name block_diffusion takes it, "
         "got objective.name masked_diffusion"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line(tokens, tmp_path, capsys, extra, message):
    argv = lm(tokens, tmp_path / "bad", "--steps", "2", *extra)
    assert one_error(capsys, argv) == message
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_the_config_section_takes_block_size(tokens):
    base = {"run": {"run_dir": "runs/x", "steps": 1}, "data": {"tokens": str(tokens)}}
    objective = {"name": "block_diffusion", "block_size": 8, "mask_id": 9, "real_tokens": 8}
    config = train_config({**base, "objective": objective}, "lm")
    assert (config.objective.name, config.objective.block_size) == ("block_diffusion", 8)
    with pytest.raises(ConfigError) as err:
        train_config({**base, "objective": {"name": "block_diffusion", "block_size": True}},
                     "lm")  # fmt: skip
    assert str(err.value).startswith("objective.block_size: expected")
    mapping = {**base, "objective": {"name": "block_diffusion", "block_size": 4},
               "data": {"path": str(tokens), "tokenizer": str(tokens)}}  # fmt: skip
    with pytest.raises(ConfigError) as err:
        train_config(mapping, "sft")
    assert str(err.value) == "objective.name: only 'dew train lm' takes it"


def test_the_clip_keys_reach_the_objective():
    from dew.models import build
    from dew.recipes.diffusion_config import build_masked_diffusion

    model = build("qwen3", vocab_size=10, emb_features=8, num_layers=1, num_heads=1,
                  head_dim=8, mlp_features=8)  # fmt: skip
    options = {"name": "block_diffusion", "block_size": 4, "mask_id": 9, "real_tokens": 9}
    clipped = build_masked_diffusion(model, 17, {**options, "mask_rate_min": 0.3,
                                                 "mask_rate_max": 0.8},
                                     pretrained=None, where="objective")  # fmt: skip
    assert (clipped.mask_rate_min, clipped.mask_rate_max) == (0.3, 0.8)
    plain = build_masked_diffusion(model, 17, options, pretrained=None, where="objective")
    assert (plain.mask_rate_min, plain.mask_rate_max) == (1e-3, 1.0)

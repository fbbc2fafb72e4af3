"""Tool episodes drawn by a vLLM or SGLang engine: ``source: {kind: environment}`` with
``rollout: {mode: async, engine: {kind: vllm | sglang, url: ...}}`` in ``dew train grpo``.
Every turn of every episode is one token-in, token-out request to the engine, each update's
weights are pushed to it (a reload from ``rollout.engine.directory``), and the episodes'
turns come back to the worker. The engines are dew-rollout's stand-ins
(``packages/dew-rollout/tests/rollout_fakes.py``), which answer in the engines' own wire
formats; their ids depend on the prompt, the seed and the weights version they serve."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from test_recipe_environment import WORKER, grpo_config, workers_alive

from dew.cli import main

ROLLOUT_TESTS = Path(__file__).resolve().parents[2] / "dew-rollout" / "tests"
sys.path.insert(0, str(ROLLOUT_TESTS))

from rollout_engine import tiny_pretrained  # noqa: E402
from rollout_fakes import FakeSGLang, FakeVLLM  # noqa: E402

#: The route both engines draw a turn on: token ids in, token ids and log-probabilities out.
ROUTE = "/v1/completions"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen3 the engine is taken to have started on (and Dew trains)."""
    path = tmp_path_factory.mktemp("engine_policy") / "policy"
    tiny_pretrained().save(path, dtype="float32")
    return path


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_episodes_are_drawn_turn_by_turn_from_the_engine(kind, checkpoint, tmp_path) -> None:
    worker = tmp_path / "tool_worker.py"
    worker.write_text(WORKER)
    # ids 0..7 only: the worker's vocabulary (id 1 ends a turn)
    engine = FakeVLLM(vocab=8) if kind == "vllm" else FakeSGLang(vocab=8)
    try:
        run_dir = tmp_path / "run"
        path = grpo_config(worker, run_dir, 2)
        raw = json.loads(path.read_text())
        raw["model"] = {"pretrained": str(checkpoint)}
        raw["objective"].update(groups=2, behavior_importance=2.0)
        raw["rollout"] = {"mode": "async", "ahead": 1, "truncation": "score",
                          "engine": {"kind": kind, "url": engine.url,
                                     "directory": str(checkpoint)}}  # fmt: skip
        path.write_text(json.dumps(raw))
        assert main(["train", "grpo", "--config", str(path)]) == 0
        drawn = [json.loads(line) for line in open(run_dir / "rollout.jsonl")]
        assert [r["lag"] for r in drawn] == [0, 1] and [r["pushed"] for r in drawn] == [-1, 1]
        episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
        assert len(episodes) == 2 * 2 * 2  # steps * tasks per batch * groups
        completed = [e for e in episodes if e["status"] == "completed"]
        assert completed and all(e["detail"] in ("0", "1") for e in completed)
        # the draws (the end-of-run probe of vLLM's prompt log-probabilities left out)
        turns = [body for name, _, body in engine.calls
                 if name == ROUTE and body.get("prompt_logprobs") is None]  # fmt: skip
        # one request per turn: as many as the episodes' turns (a cancelled draw aside)
        assert len(turns) >= sum(e["turns"] for e in episodes)
        # a second turn's prompt holds the first turn's context, reply and the tool's answer
        prompts = [t["prompt"] for t in turns]
        assert any(p[:2] == [5, p[1]] and len(p) > 3 and p[-1] == p[1] for p in prompts)
        pushes = engine.reloads if kind == "vllm" else len(engine.loads)
        assert pushes >= 1  # the first update's weights, before batch 1 was drawn
        metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        assert [m["step"] for m in metrics] == [1, 2]
        assert all(np.isfinite(m["loss"]) for m in metrics)
        assert workers_alive(worker) == []
    finally:
        engine.close()

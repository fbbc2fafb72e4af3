"""``dew chain`` stages of the kinds only ``dew train`` had: a bad ``source`` key of a GRPO
stage on tool episodes, and a flow stage without ``dew-flow``, are one-line errors named by
the stage's key (``stages.<i>.source.<key>``, ``stages.<i>.kind``), given before anything
is written."""

from __future__ import annotations

import json
import sys

import pytest

from dew.cli import main
from dew.recipes import plugins

PAIR = {"chosen": [5, 6, 7], "rejected": [5, 6, 3], "chosen_mask": [0, 1, 1],
        "rejected_mask": [0, 1, 1]}  # fmt: skip
DPO = {"name": "dpo", "steps": 1, "data": {"type": "PreferencePairs", "records": [PAIR],
                                           "seq_len": 8}}  # fmt: skip
SOURCE = {"kind": "environment", "command": [sys.executable, "-c", "pass"], "tasks": 4}
TOOLS = {"name": "tools", "steps": 1, "eos_id": 1, "max_new_tokens": 4, "source": SOURCE}
MODEL = {"name": "causal_transformer", "vocab_size": 8, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32, "max_seq_len": 32}  # fmt: skip


def _error(tmp_path, capsys, stages) -> str:
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"output": "out", "batch": 2, "model": MODEL, "stages": stages}))
    assert main(["chain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything was written
    return err[0]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"source": {**SOURCE, "tasks": 0}},
         "stages.1.source.tasks: expected an integer >= 1, got 0"),
        ({"source": {**SOURCE, "turns": 2}}, "stages.1.source.turns: unknown key"),
        ({"source": {**SOURCE, "command": ["no-such-program-of-dew"]}},
         "stages.1.source.command: no executable 'no-such-program-of-dew' on PATH"),
        ({"source": {**SOURCE, "verifier": "outcome:x:y"}},
         "stages.1.source.verifier: expected 'outcome' or 'module:object'"),
        ({"eos_id": None}, "stages.1.eos_id: required with source.kind environment"),
        ({"reward": "math"}, "stages.1.reward: source.kind environment scores episodes"),
        ({"kind": "dpo"}, "stages.1.source.kind: environment episodes train with a grpo or ppo "
         "stage, not a dpo one"),
        ({"data": DPO["data"]}, "stages.1.data: source.kind environment draws task ids"),
    ],
)  # fmt: skip
def test_a_bad_source_key_names_the_stage(tmp_path, capsys, change, expected) -> None:
    line = _error(tmp_path, capsys, [DPO, {**TOOLS, **change}])
    assert line.startswith("dew: error: ") and expected in line, line


def test_a_flow_stage_without_dew_flow_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plugins, "entry_points", lambda **kwargs: [])  # dew-flow not installed
    flow = {"name": "flow", "kind": "flow-grpo", "steps": 1, "data": {"labels": [0, 1]}}
    line = _error(tmp_path, capsys, [DPO, flow])
    assert "stages.1.kind: needs the dew-flow distribution (pip install dew-flow)" in line, line

"""A ``dew chain`` stage of kind ``flow`` (alias ``flow-grpo``): it trains with the code of
``dew train flow`` next to a text stage, a rerun of the finished chain restores every stage
without training, and a flow stage's mistakes are one-line errors named by the stage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dew.cli import main
from dew.testing import checkpoint_arrays

PAIR = {"chosen": [5, 6, 7], "rejected": [5, 6, 3], "chosen_mask": [0, 1, 1],
        "rejected_mask": [0, 1, 1]}  # fmt: skip
DPO = {"name": "dpo", "steps": 1, "data": {"type": "PreferencePairs", "records": [PAIR],
                                           "seq_len": 8}}  # fmt: skip
FLOW = {"name": "flow", "kind": "flow", "steps": 2,
        "model": {"preset": "flow", "emb_features": 16, "num_layers": 1, "num_heads": 2},
        "data": {"labels": [0, 1, 2, 3]},
        "objective": {"reward": "colour", "colour": "red", "groups": 2, "steps": 3}}  # fmt: skip
MODEL = {"name": "causal_transformer", "vocab_size": 8, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32, "max_seq_len": 16}  # fmt: skip


def _write(tmp_path, stages) -> str:
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"output": "out", "batch": 2, "log_every": 1, "model": MODEL,
                                "optimizer": {"name": "adam", "learning_rate": 1e-2},
                                "stages": stages}))  # fmt: skip
    return str(path)


def test_a_chain_trains_a_flow_stage_and_a_rerun_restores_it(tmp_path, capsys) -> None:
    config = _write(tmp_path, [FLOW, DPO])
    assert main(["chain", config]) == 0
    out = capsys.readouterr().out
    assert "flow (flow): step 2, 2 updates" in out and "dpo (dpo): step 1, 1 updates" in out
    flow_dir = tmp_path / "out" / "flow"
    assert json.load(open(flow_dir / "config.json"))["kind"] == "flow"
    metrics = (flow_dir / "metrics.jsonl").read_text()
    assert [json.loads(line)["step"] for line in metrics.splitlines()] == [1, 2]
    trained = checkpoint_arrays(flow_dir)
    assert main(["chain", config]) == 0  # finished: every stage restores, none trains
    assert "flow (flow): step 2, 2 updates" in capsys.readouterr().out
    assert (flow_dir / "metrics.jsonl").read_text() == metrics
    for a, b in zip(checkpoint_arrays(flow_dir), trained, strict=True):
        np.testing.assert_array_equal(a, b)
    # another flow config over the trained output is refused naming the key
    changed = {**FLOW, "objective": {**FLOW["objective"], "colour": "blue"}}
    assert main(["chain", _write(tmp_path, [changed, DPO])]) == 2
    assert "stages.0.objective.colour" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        ({**FLOW, "from": "dpo"}, "stages.1.from: a flow stage trains its own image model"),
        ({**FLOW, "beta": 0.1}, "stages.1.beta: unknown key"),
        ({**FLOW, "objective": {**FLOW["objective"], "groups": 1}},
         "stages.1.objective.groups: expected an integer >= 2"),
        ({**FLOW, "model": {**FLOW["model"], "num_heads": 3}},
         "stages.1.model.num_heads: 3 does not divide model.emb_features"),
    ],
)  # fmt: skip
def test_a_bad_flow_stage_is_one_line_naming_its_key(tmp_path, capsys, stage, expected):
    assert main(["chain", _write(tmp_path, [DPO, stage])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()

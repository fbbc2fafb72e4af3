"""A ``dew chain`` stage on a ``TokenFile``: an ``lm`` stage over every id of a flat token
file, whose policy the next stage starts from. Ids outside the model's vocabulary, a kind
other than ``lm`` and a missing file are one-line errors named by the stage's key, given
before anything is written."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.data.tokens import write_tokens
from dew.recipes.generate import load_model

MODEL = {"name": "causal_transformer", "vocab_size": 8, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32, "max_seq_len": 16}  # fmt: skip
#: Rows of 4 ids: 5 then 6 then 7 then 2 (the model can learn every next id exactly).
PATTERN = np.tile(np.asarray([5, 6, 7, 2], np.uint16), 64)


def _config(tmp_path, stages, tokens=PATTERN):
    write_tokens(tmp_path / "tokens.bin", tokens, "uint16")
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"output": "out", "batch": 4, "seed": 0, "log_every": 1, "model": MODEL,
                                "optimizer": {"name": "adam", "learning_rate": 3e-2},
                                "stages": stages}))  # fmt: skip
    return path


LM = {"name": "lm", "steps": 30, "data": {"type": "TokenFile", "path": "tokens.bin", "seq_len": 3}}


def test_an_lm_stage_learns_the_token_file_and_hands_its_policy_on(tmp_path, capsys) -> None:
    sft = {"name": "again", "kind": "lm", "steps": 1,
           "data": {"type": "TokenFile", "path": "tokens.bin", "seq_len": 3}}  # fmt: skip
    assert main(["chain", str(_config(tmp_path, [LM, sft]))]) == 0
    out = capsys.readouterr().out
    assert "lm (lm): step 30, 30 updates" in out and "again (lm): step 1" in out
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "out" / "lm" / "metrics.jsonl")]
    assert losses[-1] < 0.1 * losses[0], losses
    # the model predicts the file's next ids: greedy continuation of [5] is 6, 7, 2
    loaded = load_model(str(tmp_path / "out" / "lm"))
    logits = loaded.model.apply(loaded.variables, np.asarray([[5, 6, 7]], np.int32))
    assert np.argmax(np.asarray(logits)[0], -1).tolist() == [6, 7, 2]
    # the next stage started from the lm stage's policy: its first loss is already low
    again = json.loads(open(tmp_path / "out" / "again" / "metrics.jsonl").readline())["loss"]
    assert again < 0.1 * losses[0]
    first = jax.tree.leaves(load_model(str(tmp_path / "out" / "again")).variables)
    assert all(np.isfinite(np.asarray(x)).all() for x in first)


@pytest.mark.parametrize(
    ("stage", "tokens", "expected"),
    [
        (LM, np.asarray([5, 6, 9, 2] * 8, np.uint16),
         "stages.0.data.path: '"),
        ({**LM, "kind": "sft"}, PATTERN, "stages.0: Stage.kind (lm): expected lm for TokenFile "
         "data, got 'sft'"),
        ({**LM, "data": {**LM["data"], "path": "missing.bin"}}, PATTERN,
         "stages.0.data.path: "),
        ({**LM, "data": {**LM["data"], "seq": 3}}, PATTERN, "stages.0.data.seq: unknown key"),
    ],
)  # fmt: skip
def test_a_bad_token_file_stage_is_one_line(tmp_path, capsys, stage, tokens, expected) -> None:
    assert main(["chain", str(_config(tmp_path, [stage], tokens))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()
    if stage is LM:  # the id outside the vocabulary, with its position
        assert "holds id 9 at position 2, outside model.vocab_size 8" in err[0]

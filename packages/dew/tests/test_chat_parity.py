"""Chat ids and assistant masks against TRL 1.16.0's SFTTrainer (recorded by tools/parity_chat.py).

The fixture holds the conversations, the tokenizer TRL used (its template marks assistant
output with {% generation %}), and TRL's input_ids and assistant masks. Dew renders the same
conversations one prefix at a time; the ids and the ASSISTANT role must match exactly.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dew.data.chat import ChatMessages, Role
from dew.data.chat.render import render_roles
from dew.data.chat.template import ChatTokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures", "chat")


@pytest.fixture(scope="module")
def recorded():
    with open(os.path.join(FIXTURES, "trl_sft.json"), encoding="utf-8") as f:
        return json.load(f)


def test_ids_and_assistant_masks_match_trl(recorded):
    meta = json.load(open(os.path.join(FIXTURES, "trl_sft.meta.json")))
    assert meta["package"] == "trl" and meta["version"] == "1.16.0"
    tok = ChatTokenizer.load(os.path.join(FIXTURES, "tokenizer"))
    convs = recorded["conversations"]
    assert len(convs) == len(recorded["input_ids"]) >= 6
    largest = 0
    for i, conv in enumerate(convs):
        messages = conv.get("messages", conv.get("prompt"))
        ids, roles = render_roles(tok, messages, conv.get("tools"), where=f"conversation {i}")
        want_ids = np.asarray(recorded["input_ids"][i])
        want_mask = np.asarray(recorded["assistant_masks"][i]).astype(bool)
        assert ids.tolist() == want_ids.tolist(), f"conversation {i}: ids differ"
        got_mask = roles == Role.ASSISTANT
        largest = max(largest, int((got_mask != want_mask).sum()))
        np.testing.assert_array_equal(got_mask, want_mask, err_msg=f"conversation {i}")
        assert want_mask.any()
    assert largest == 0


def test_packed_rows_carry_the_same_tokens(recorded, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in recorded["conversations"]) + "\n")
    spec = ChatMessages(str(path), os.path.join(FIXTURES, "tokenizer"), seq_len=255, shuffle=False)
    docs = spec.encode(str(path), spec.chat_tokenizer())
    for (ids, roles), want, mask in zip(docs, recorded["input_ids"], recorded["assistant_masks"]):
        assert ids.tolist() == want
        assert (roles == Role.ASSISTANT).astype(int).tolist() == mask

"""Dew's tokenisation of TRL-layout preference pairs against TRL 1.16.0's own.

``tools/parity_dpo_tokens.py`` trained two small tokenizers (``chatml``: byte-level, no BOS;
``bos``: Metaspace with a BOS post-processor), saved them under ``tests/fixtures/dpo_tokens``
and ran TRL's ``DPOTrainer`` dataset preparation and ``DataCollatorForPreference`` on text
pairs (explicit and implicit prompt) and conversational pairs (explicit and implicit
prompt). Here ``dew.data.preference_text.tokenize_row``, and ``PreferencePairs`` on top of it,
read the same pairs with the same tokenizer files: each side's ids and completion mask must be
TRL's exactly, so a dropped or doubled EOS, a missing BOS or a shifted prompt/completion
boundary fails. ``implicit_text_prompt`` is also checked against TRL's own split of texts
that share a start (``trl.data_utils.extract_prompt``).

One difference is by design and pinned instead: when a conversational completion holds
several messages, TRL trains on everything after the prompt while Dew trains only on the
assistant messages, so the user turn inside the completion and the next assistant header stay
0 in Dew's mask (``MULTI_MESSAGE_GAP`` holds the exact text left out). Dew does not truncate:
a pair longer than ``seq_len`` is refused where TRL's ``max_length`` would cut it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dew.data.chat.template import ChatTokenizer
from dew.data.preference import PreferencePairs
from dew.data.preference_text import implicit_text_prompt, tokenize_row

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dpo_tokens"
SIDECAR = json.loads((FIXTURES / "trl_dpo_tokens.json").read_text(encoding="utf-8"))
TOKENIZERS = SIDECAR["tokenizers_used"]
SIDES = ("chosen", "rejected")
CASES = [
    (name, group, index)
    for name, spec in TOKENIZERS.items()
    for group, records in spec["groups"].items()
    for index in range(len(records))
]
# What TRL trains on and Dew does not, per tokenizer, in a completion of several messages.
MULTI_MESSAGE_GAP = {
    "chatml": "<|im_start|>user\nThen?<|im_end|>\n<|im_start|>assistant\n",
    "bos": "<|role|>user<|content|>Then?<|eot|><|role|>assistant<|content|>",
}


def _multi_message(group: str, pair: dict[str, Any]) -> bool:
    return group == "conversational" and len(pair["chosen"]) > 1


def _record(name: str, group: str, index: int) -> dict[str, Any]:
    return TOKENIZERS[name]["groups"][group][index]


def test_sidecar_names_the_reference_and_its_files() -> None:
    assert SIDECAR["package"] == "trl"
    assert SIDECAR["version"] == "1.16.0"
    assert len(SIDECAR["wheel_sha256"]) == 64
    assert SIDECAR["options"]["max_length"] is None
    assert set(TOKENIZERS) == {"chatml", "bos"}
    for name, spec in TOKENIZERS.items():
        for file, digest in spec["files_sha256"].items():
            assert hashlib.sha256((FIXTURES / name / file).read_bytes()).hexdigest() == digest
        assert set(spec["groups"]) == {
            "text", "text_implicit", "conversational", "conversational_implicit"
        }  # fmt: skip


def test_fixtures_cover_the_cases_that_matter() -> None:
    text = [r["pair"] for r in TOKENIZERS["chatml"]["groups"]["text"]]
    assert any(p["prompt"] and not p["prompt"].endswith(" ") for p in text)
    assert any(p["prompt"].endswith(" ") for p in text)
    assert any(any(ord(c) > 127 for c in p["chosen"]) for p in text)
    assert any(p["chosen"].endswith("<|im_end|>") for p in text)
    conversations = TOKENIZERS["chatml"]["groups"]["conversational"]
    assert any(len(r["pair"]["prompt"]) > 2 for r in conversations)
    for spec in TOKENIZERS.values():  # a long pair in every layout
        assert max(len(r["input_ids"][0]) for r in spec["groups"]["text"]) > 120
        assert max(len(r["input_ids"][0]) for r in spec["groups"]["conversational"]) > 90
    # The BOS tokenizer's text rows start with its BOS; the other's never do.
    bos = ChatTokenizer.load(FIXTURES / "bos").tokenizer.token_to_id("<s>")
    assert all(r["input_ids"][0][0] == bos for r in TOKENIZERS["bos"]["groups"]["text"])


@pytest.mark.parametrize(("name", "group", "index"), CASES)
def test_ids_and_masks_match_trl(name: str, group: str, index: int) -> None:
    record = _record(name, group, index)
    tokenizer = ChatTokenizer.load(FIXTURES / name)
    ours = tokenize_row(record["pair"], tokenizer, f"{name} {group} {index}")
    for side_index, side in enumerate(SIDES):
        trl_ids = record["input_ids"][side_index]
        trl_mask = record["completion_mask"][side_index]
        # TRL's collated row is its prepared prompt ids followed by the side's ids.
        assert trl_ids == record["prompt_ids"] + record[f"{side}_ids"]
        assert ours[side] == trl_ids, side
        if not _multi_message(group, record["pair"]):
            assert ours[f"{side}_mask"] == trl_mask, side
            continue
        # By design: Dew leaves out exactly the later non-assistant turn and its next header.
        ours_mask = np.asarray(ours[f"{side}_mask"])
        theirs = np.asarray(trl_mask)
        assert np.all(ours_mask <= theirs), side
        gap = [t for t, a, b in zip(trl_ids, ours_mask, theirs) if b and not a]
        assert tokenizer.decode(gap) == MULTI_MESSAGE_GAP[name], side


@pytest.mark.parametrize("split", SIDECAR["extract_prompt"], ids=lambda s: s["chosen"])
def test_implicit_text_prompt_splits_as_trl(split: dict[str, Any]) -> None:
    assert list(implicit_text_prompt(split["chosen"], split["rejected"])) == split["trl"]


def test_texts_that_differ_at_once_have_no_prompt() -> None:
    # TRL's split looks at the last character here (index -1); Dew gives an empty prompt.
    assert implicit_text_prompt("Abc ", "Xyz") == ("", "Abc ", "Xyz")


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_preference_pairs_pads_trls_rows(name: str) -> None:
    """The public reader gives the same rows, right-padded with the tokenizer's pad id."""
    records = [
        r
        for group in ("text", "text_implicit", "conversational", "conversational_implicit")
        for r in TOKENIZERS[name]["groups"][group]
        if not _multi_message(group, r["pair"])
    ]
    width = max(len(ids) for r in records for ids in r["input_ids"])
    pairs = PreferencePairs(
        records=tuple(json.dumps(r["pair"]) for r in records),
        tokenizer=str(FIXTURES / name),
        seq_len=width,
    )
    pad = ChatTokenizer.load(FIXTURES / name).pad_id
    assert pairs.pad_id == pad
    for row, record in enumerate(records):
        for side_index in range(2):
            ids = record["input_ids"][side_index]
            mask = record["completion_mask"][side_index]
            expected_ids = ids + [pad] * (width - len(ids))
            expected_mask = mask + [0] * (width - len(ids))
            got = pairs.arrays["input_ids"][row, side_index].tolist()
            assert got == expected_ids
            assert pairs.arrays["completion_mask"][row, side_index].tolist() == expected_mask


def test_a_pair_longer_than_seq_len_is_refused_not_truncated() -> None:
    record = max(TOKENIZERS["chatml"]["groups"]["text"], key=lambda r: len(r["input_ids"][0]))
    longest = len(record["input_ids"][0])
    with pytest.raises(ValueError, match=f"chosen has {longest} ids, more than seq_len"):
        PreferencePairs(
            records=(json.dumps(record["pair"]),),
            tokenizer=str(FIXTURES / "chatml"),
            seq_len=longest - 1,
        )

"""ChatMessages: reading, validation, per-prefix roles, packing and SFT on packed rows."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _chat_tokenizer import CONVERSATIONS, TEMPLATE, build_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.data import Loading, Partition
from dew.data.chat import ChatMessages, Role
from dew.data.chat.messages import pack
from dew.data.chat.render import render_roles
from dew.data.chat.template import ChatTokenizer
from dew.testing import tiny_decoder


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return ChatTokenizer.load(tok_dir)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def spans(ids, roles, tok, role):
    """Decoded text of each maximal run of ``role``."""
    out, cur = [], []
    for i, r in zip(ids, roles):
        if r == role:
            cur.append(int(i))
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    if cur:
        out.append(tok.decode(cur))
    return out


def test_roles_per_token(tok):
    conv = CONVERSATIONS[1]["messages"]
    ids, roles = render_roles(tok, conv)
    assert ids.tolist() == tok.encode(tok.render(conv))
    assert spans(ids, roles, tok, Role.ASSISTANT) == [
        "He kicked it to his dog.<|im_end|>\n",
        "The dog ran after it.<|im_end|>\n",
    ]
    # the generation header is outside the assistant span
    assert spans(ids, roles, tok, Role.NONE) == ["<|im_start|>assistant\n"] * 2
    assert spans(ids, roles, tok, Role.SYSTEM) == ["<|im_start|>system\nYou are terse.<|im_end|>\n"]
    assert spans(ids, roles, tok, Role.USER) == [
        "<|im_start|>user\nTom had a red ball.<|im_end|>\n",
        "<|im_start|>user\nThen?<|im_end|>\n",
    ]


def test_tools_and_tool_calls_pass_through(tok):
    row = CONVERSATIONS[2]
    ids, roles = render_roles(tok, row["messages"], row["tools"])
    text = tok.decode(ids.tolist())
    assert '"name": "get_weather"' in text and '"description": "Weather of a city"' in text
    assistant = spans(ids, roles, tok, Role.ASSISTANT)
    assert assistant[0] == (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>\n'
    )
    assert spans(ids, roles, tok, Role.TOOL) == ["<|im_start|>tool\nsunny<|im_end|>\n"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        # writes only the last message, so every longer prefix rewrites earlier tokens
        ("{{ messages[-1].role }}: {{ messages[-1].content }}\n",
         "rendering message 1 changes earlier tokens (first difference at token 6); the chat "
         "template is not append-only here"),
        ("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no "
         "assistants here') }}{% endif %}{{ m.content }}{% endfor %}",
         "the chat template failed at message 1 (TemplateError: no assistants here)"),
        ("{% for m in messages %}{{ m.content.nosuch() }}{% endfor %}",
         "the chat template failed at message 0 (UndefinedError: "),
    ],
)  # fmt: skip
def test_template_errors_name_the_file_line(tok, tmp_path, template, message):
    """Rows are named by their line in the file (blank lines count), not by their index."""
    bad = ChatTokenizer(tok.tokenizer, template)
    path = write_jsonl(tmp_path / "t.jsonl", ["", json.dumps(CONVERSATIONS[0])])
    with pytest.raises(ValueError) as caught:
        ChatMessages(path, bad, seq_len=512).encode(path, bad)
    assert str(caught.value).startswith(f"{path}: line 2: {message}")


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ('{"messages": [', r"bad.jsonl: line 2: malformed JSON"),
        ({"other": []}, r"bad.jsonl: line 2: no 'messages' column"),
        ({"messages": [{"role": "user", "content": 3}]}, r"bad.jsonl: line 2: message 0 content should be a string"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, r"bad.jsonl: line 2: message 0 role: unknown role 'wizard'"),
        ({"messages": []}, r"bad.jsonl: line 2: empty conversation"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, r"bad.jsonl: line 2: the conversation starts with an assistant message \(role 'assistant'\); expected system or user"),
        ({"messages": [{"role": "tool", "content": "4"}, {"role": "user", "content": "hi"}]}, r"bad.jsonl: line 2: the conversation starts with a tool message \(role 'tool'\); expected system or user"),
        ({"messages": [{"role": "ipython", "content": "4"}]}, r"bad.jsonl: line 2: the conversation starts with a tool message \(role 'ipython'\)"),
        ({"messages": [{"role": "user", "content": "word " * 200}]}, r"bad.jsonl: line 2: the conversation renders to \d+ tokens, more than a row of seq_len \+ 1 = 33"),
    ],
)  # fmt: skip
def test_bad_input_names_file_and_row(tok_dir, tmp_path, row, match):
    path = write_jsonl(tmp_path / "bad.jsonl", [CONVERSATIONS[0], row])
    with pytest.raises(ValueError, match=match) as info:
        ChatMessages(path, tok_dir, seq_len=32).load(batch=1)
    assert "bad.jsonl" in str(info.value)


def test_parquet_verl_layout_matches_jsonl(tok_dir, tmp_path):
    rows = [dict(r) for r in CONVERSATIONS]
    jsonl = write_jsonl(tmp_path / "c.jsonl", rows)
    table = pa.Table.from_pylist(
        [
            {
                "prompt": json.dumps(r.get("messages", r.get("prompt"))),
                "tools": json.dumps(r["tools"]) if "tools" in r else None,
            }
            for r in rows
        ]
    )
    pq.write_table(table, tmp_path / "c.parquet")
    a = ChatMessages(jsonl, tok_dir, seq_len=255, shuffle=False).load(batch=2)
    b = ChatMessages(str(tmp_path / "c.parquet"), tok_dir, seq_len=255, shuffle=False).load(batch=2)
    x, y = next(a.stream(Partition())), next(b.stream(Partition()))
    for k in x:
        np.testing.assert_array_equal(x[k], y[k])
    # struct columns (a list of message structs) read the same way
    pq.write_table(pa.Table.from_pylist([{"messages": r["messages"]} for r in rows[:2]]),
                   tmp_path / "s.parquet")  # fmt: skip
    c = ChatMessages(str(tmp_path / "s.parquet"), tok_dir, seq_len=255, shuffle=False)
    d = ChatMessages(
        write_jsonl(tmp_path / "s.jsonl", rows[:2]), tok_dir, seq_len=255, shuffle=False
    )
    tk = c.chat_tokenizer()
    assert [i.tolist() for i, _ in c.encode(c.path, tk)] == [
        i.tolist() for i, _ in d.encode(d.path, tk)
    ]


def test_packing_fields_and_resume(tok_dir, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 3)
    spec = ChatMessages(path, tok_dir, seq_len=191, seed=3)
    data = spec.load(batch=4)
    it = data.stream(Partition())
    first = [next(it) for _ in range(5)]
    for b in first:
        assert set(b) == {"text", "text_roles", "text_segment_ids", "text_positions"}
        for v in b.values():
            assert v.shape == (4, 192)
        pad = b["text_segment_ids"] == 0
        assert (b["text_roles"][pad] == Role.NONE).all() and (b["text"][pad] == 0).all()
        for r in range(4):
            seg, pos = b["text_segment_ids"][r], b["text_positions"][r]
            for s in set(seg[seg > 0].tolist()):
                assert pos[seg == s].tolist() == list(range(int((seg == s).sum())))
    # every conversation appears whole, once per epoch
    total = sum(int((b["text_roles"] == Role.ASSISTANT).sum()) for b in first)
    assert total > 0
    resumed = next(data.stream(Partition(), start=3))
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], first[3][k])
    halves = [next(data.stream(Partition(i, 2), start=3)) for i in range(2)]
    for k in resumed:
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), resumed[k])
    procs = ChatMessages(
        path, tok_dir, seq_len=191, seed=3, loading=Loading(workers=2, read_buffer=2)
    )
    it = procs.load(batch=4).stream(Partition())
    for b in first:
        got = next(it)
        for k in b:
            np.testing.assert_array_equal(got[k], b[k])


def test_a_late_batch_packs_one_epoch_not_every_epoch_before_it(tok_dir, tmp_path, monkeypatch):
    """Batches read in order pack each epoch once, and a batch many epochs in packs only its own
    epoch: the loader's cost per batch does not grow with the step (it once re-packed epochs
    0..e for every batch of epoch e)."""
    from dew.data.chat import messages

    spec = ChatMessages(write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 3), tok_dir,
                        seq_len=191, seed=3)  # fmt: skip
    docs = spec.encode(spec.path, spec.chat_tokenizer())
    epochs, seen = 0, 0  # the epochs that batches 0..399 span, each epoch its own shuffle
    while seen < 400:
        order = np.random.default_rng([3, epochs]).permutation(len(docs))
        seen += len(pack([docs[i] for i in order], 192, 0)["text"]) // 2
        epochs += 1
    packings: list[int] = []
    real_pack = messages.pack
    monkeypatch.setattr(messages, "pack", lambda *a: packings.append(1) or real_pack(*a))
    source = messages._ChatSource(docs, 192, 2, 0, 3, True, None)
    batches = [source.batch_at(Partition(), i) for i in range(400)]
    assert epochs >= 20  # the batches span many epochs
    assert len(packings) == epochs
    packings.clear()
    fresh = messages._ChatSource(docs, 192, 2, 0, 3, True, None)
    np.testing.assert_array_equal(fresh.batch_at(Partition(), 399)["text"], batches[399]["text"])
    assert len(packings) == 1
    # the same batches through the Dataset, resumed late
    late = next(spec.load(batch=2).stream(Partition(), start=399))
    np.testing.assert_array_equal(late["text"], batches[399]["text"])


def test_template_file_roundtrip(tok_dir):
    tok = ChatTokenizer.load(tok_dir)
    assert tok.chat_template == TEMPLATE and tok.pad_id == 0
    assert os.path.isfile(os.path.join(tok_dir, "tokenizer.json"))


def test_sft_on_chat_file_with_validation(tok_dir, tmp_path):
    import jax
    import optax

    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    train = write_jsonl(tmp_path / "train.jsonl", CONVERSATIONS * 4)
    val = write_jsonl(tmp_path / "val.jsonl", CONVERSATIONS[:2])
    spec = ChatMessages(train, tok_dir, seq_len=191, val_path=val)
    data = spec.load(batch=4)
    vocab = spec.chat_tokenizer().tokenizer.get_vocab_size()
    model = tiny_decoder(vocab, 192)
    objective = LMObjective(model, spec.seq_len, loss_role=Role.ASSISTANT, ema_decay=0.999)
    trainer = Trainer(objective, optax.adamw(3e-3), key=jax.random.key(0))
    state = trainer.fit(data, steps=12, log_every=4, eval_every=6, run_dir=tmp_path / "run")
    records = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [4, 6, 8, 12]
    vdocs = spec.encode(val, spec.chat_tokenizer())
    expected_tokens = sum(int((roles[1:] == Role.ASSISTANT).sum()) for _, roles in vdocs)
    evals = [r for r in records if "val/loss" in r]
    assert [r["step"] for r in evals] == [6, 12]
    for r in evals:
        assert r["val/perplexity"] == pytest.approx(np.exp(r["val/loss"]), rel=1e-6)
        assert r["val/tokens"] == expected_tokens
    assert evals[1]["val/loss"] < evals[0]["val/loss"]
    assert records[-1]["loss"] < records[0]["loss"]
    assert int(state.updates) == 12 and state.ema is not None


@given(st.lists(st.integers(1, 12), min_size=1, max_size=30), st.integers(12, 20))
@settings(max_examples=50, deadline=None)
def test_pack_keeps_documents_whole_and_in_order(lengths, width):
    docs = [
        (np.arange(1, n + 1, dtype=np.int32) + 100 * i, np.full(n, i % 5, np.int8))
        for i, n in enumerate(lengths)
    ]
    rows = pack(docs, width, pad_id=0)
    assert all(v.shape[1] == width for v in rows.values())
    seen = []
    for r in range(rows["text"].shape[0]):
        seg = rows["text_segment_ids"][r]
        real = seg > 0
        # documents are a prefix of the row, then padding
        assert not real[np.argmin(real) :].any() or real.all()
        for s in range(1, int(seg.max()) + 1):
            sel = seg == s
            assert rows["text_positions"][r][sel].tolist() == list(range(int(sel.sum())))
            seen.append(rows["text"][r][sel].tolist())
            assert len(set(rows["text_roles"][r][sel].tolist())) == 1
        assert (rows["text"][r][~real] == 0).all() and (rows["text_roles"][r][~real] == 0).all()
    assert seen == [d.tolist() for d, _ in docs]
    # a row is only closed when the next document does not fit in it
    used = (rows["text_segment_ids"] > 0).sum(1)
    firsts = [rows["text"][r][rows["text_segment_ids"][r] == 1] for r in range(len(used))]
    for r in range(len(used) - 1):
        assert used[r] + len(firsts[r + 1]) > width


def test_hub_ids_need_the_hf_extra(tok_dir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"'hf' extra"):
        ChatMessages("someone/chat-dataset", tok_dir, seq_len=32).load(batch=1)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"'hf' extra"):
        ChatMessages("x.jsonl", "Someone/Model", seq_len=32).chat_tokenizer()

"""verl interop (``dew.objectives.rl.verl``) against rows and tensors recorded from verl 0.9.1.

The fixtures in ``tests/fixtures/verl_interop/`` come from ``tools/verl_interop_reference.py``
(real verl in the reference env): two ``AgentLoopOutput`` rows (a tool loop with routed
experts, a video turn), their ``as_dict()`` tensors and the padded batch verl's agent-loop
post-processing builds, and the parquet verl's ``gsm8k_tool_agent_loop.py`` preprocessing
script writes. Nothing here imports torch or verl.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dew.data import Prompts
from dew.data.chat.template import ChatTokenizer
from dew.objectives.rl import verl
from dew.sessions import Call, Session, Status, pack

FIXTURES = Path(__file__).parent / "fixtures" / "verl_interop"


def _decode(value: Any, arrays: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return arrays[value["__array__"]]
        return {k: _decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    return value


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    arrays = dict(np.load(FIXTURES / "arrays.npz"))
    rows = _decode(json.loads((FIXTURES / "rows.json").read_text()), arrays)
    tensors = dict(np.load(FIXTURES / "tensors.npz"))
    sidecar = json.loads((FIXTURES / "verl_interop.json").read_text())
    return {"rows": rows, "tensors": tensors, "sidecar": sidecar}


def _same(a: Any, b: Any, where: str = "row") -> None:
    """Deep equality; arrays must match in dtype, shape and every value."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: {sorted(a)} vs {sorted(b)}"
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} vs {b!r}"


def test_fixture_provenance(recorded: dict[str, Any]) -> None:
    sidecar = recorded["sidecar"]
    assert (sidecar["package"], sidecar["version"]) == ("verl", "0.9.1")
    assert len(sidecar["wheel_sha256"]) == 64
    assert "verl/experimental/agent_loop/agent_loop.py" in sidecar["source_sha256"]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, stop) of each run of 1s, by a plain scan."""
    out, start = [], None
    for i, flag in enumerate([*mask, 0]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    return out


def test_native_tool_row_imports_and_reexports_unchanged(recorded: dict[str, Any]) -> None:
    row = recorded["rows"]["tool_loop"]
    (trajectory,) = verl.from_verl([row])
    session = trajectory.session
    assert (session.task, session.sample, session.status) == (0, 0, Status.COMPLETED)
    assert session.reward == 1.0  # verl's gsm8k scorer, through its post-processing
    prompt, response = row["prompt_ids"], row["response_ids"]
    ids = prompt + response
    offset = len(prompt)
    spans = [(offset + a, offset + b) for a, b in _runs(row["response_mask"])]
    assert len(spans) == 2  # the tool call, then the answer
    # each run of mask-1 ids is one call whose prompt is every id before it, at the row's
    # first policy version
    assert len(session.calls) == len(spans)
    for call, (start, stop) in zip(session.calls, spans):
        assert call.prompt_ids.tolist() == ids[:start]
        assert call.sampled_ids.tolist() == ids[start:stop]
        want = row["response_logprobs"][start - offset : stop - offset]
        assert call.behavior_log_probs.tolist() == want
        assert call.version == row["extra_fields"]["min_global_steps"] == 3
        assert call.finish_reason == "stop"
        np.testing.assert_array_equal(call.routed_experts, row["routed_experts"][:stop])
    # verl's own extra_fields (raw_prompt, reward_extra_info, tool_rewards ...) and other
    # fields come back unchanged ...
    assert trajectory.extras == (row["extra_fields"],)
    assert trajectory.extras[0]["reward_extra_info"] == {"acc": 1.0}
    assert trajectory.fields[0]["num_turns"] == 4 and not trajectory.dew
    # ... and the row is written back exactly
    (again,) = verl.to_verl([trajectory])
    _same(again, row)


def test_a_trailing_observation_becomes_an_empty_call(recorded: dict[str, Any]) -> None:
    row = copy.deepcopy(recorded["rows"]["tool_loop"])
    row["response_ids"] += [7, 8, 9]
    row["response_mask"] += [0, 0, 0]
    row["response_logprobs"] += [0.0, 0.0, 0.0]
    (trajectory,) = verl.from_verl([row])
    last = trajectory.session.calls[-1]
    assert last.sampled_ids.size == 0 and last.finish_reason == "abort"
    assert last.prompt_ids.tolist() == row["prompt_ids"] + row["response_ids"]
    (again,) = verl.to_verl([trajectory])
    _same(again, row)
    batch = pack([trajectory.session], width=len(last.prompt_ids))
    assert batch["input_ids"][0].tolist() == last.prompt_ids.tolist()


def test_media_rows_refused_unless_asked(recorded: dict[str, Any]) -> None:
    row = recorded["rows"]["video"]
    with pytest.raises(verl.VerlRowError, match=r"rows\[0\]\.multi_modal_data: the row carries"):
        verl.from_verl([row])
    (trajectory,) = verl.from_verl([row], media=True)
    assert len(trajectory.session.calls) == 1
    (again,) = verl.to_verl([trajectory])
    _same(again, row)
    # the SGLang payload verl built passes through untouched
    payload = again["mm_processor_output"][0]
    assert payload["format"] == "processor_output"
    assert payload["video_grid_thw"].tolist() == [[2, 2, 2]]


def test_packing_matches_verl_tensor_mapping(recorded: dict[str, Any]) -> None:
    row, t = recorded["rows"]["tool_loop"], recorded["tensors"]
    (trajectory,) = verl.from_verl([row])
    batch = pack([trajectory.session], width=len(row["prompt_ids"]) + len(row["response_ids"]))
    segment = batch["text_segment_ids"][0] == 1
    n_prompt = len(row["prompt_ids"])
    # verl's padded batch: left-padded prompt, right-padded response, attention on real ids
    attention = t["tool_loop__batch__attention_mask"][0].astype(bool)
    np.testing.assert_array_equal(
        batch["input_ids"][0][segment], t["tool_loop__batch__input_ids"][0][attention]
    )
    np.testing.assert_array_equal(
        batch["text_positions"][0][segment], t["tool_loop__batch__position_ids"][0][attention]
    )
    response = slice(n_prompt, int(segment.sum()))
    n_response = len(row["response_ids"])
    np.testing.assert_array_equal(
        batch["response_mask"][0][response], t["tool_loop__batch__response_mask"][0][:n_response]
    )
    np.testing.assert_array_equal(
        batch["behavior_log_probs"][0][response],
        t["tool_loop__batch__rollout_log_probs"][0][:n_response],
    )
    assert not batch["response_mask"][0][:n_prompt].any()
    # routed experts: verl aligns the engine's record to every id and leaves the rest zero
    aligned = t["tool_loop__as_dict__routed_experts"]
    covered = len(row["routed_experts"])
    np.testing.assert_array_equal(batch["routed_experts"][0][segment].astype(np.int16), aligned)
    assert batch["routed"][0][segment].tolist() == [i < covered for i in range(len(aligned))]
    np.testing.assert_array_equal(t["tool_loop__batch__routed_experts"][0][attention], aligned)
    # verl puts the reward on the last response id; Dew's session carries the same reward
    rm = t["tool_loop__as_dict__rm_scores"]
    assert rm[-1] == trajectory.session.reward and not rm[:-1].any()
    # the as_dict tensors are the row's own ids and flags
    np.testing.assert_array_equal(t["tool_loop__as_dict__prompts"], row["prompt_ids"])
    np.testing.assert_array_equal(t["tool_loop__as_dict__response_mask"], row["response_mask"])


def test_samples_group_rows_the_way_verl_repeats_prompts(recorded: dict[str, Any]) -> None:
    row = recorded["rows"]["tool_loop"]
    got = verl.from_verl([row] * 6, samples=3)
    assert [(t.session.task, t.session.sample) for t in got] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda r: r.pop("response_logprobs"),
            r"rows\[0\]\.response_logprobs: expected the engine",
        ),
        (lambda r: r.update(response_logprobs=None), r"rows\[0\]\.response_logprobs"),
        (
            lambda r: r["extra_fields"].pop("min_global_steps"),
            r"rows\[0\]\.extra_fields\.min_global_steps: expected the policy version",
        ),
        (lambda r: r.update(reward_score=None), r"rows\[0\]\.reward_score: expected the"),
        (lambda r: r.update(response_mask=[1, 0]), r"rows\[0\]\.response_mask: expected 103 flags"),
        (
            lambda r: r.update(routed_experts=r["routed_experts"][:12]),
            r"rows\[0\]\.routed_experts: covers 12 ids, but the call sampled up to id 5\d\d",
        ),
    ],
)
def test_bad_rows_are_refused_by_name(recorded: dict[str, Any], change: Any, match: str) -> None:
    row = copy.deepcopy(recorded["rows"]["tool_loop"])
    change(row)
    with pytest.raises(verl.VerlRowError, match=match):
        verl.from_verl([row])


# ---------------------------------------------------------------- Dew's own sessions


def _sessions() -> list[Session]:
    rng = np.random.default_rng(7)

    def lp(n: int) -> list[float]:
        return (-rng.random(n)).tolist()

    def routing(n: int) -> np.ndarray:
        return rng.integers(0, 16, (n, 3, 2)).astype(np.int16)

    # session 0: two chains (the third call starts a fresh context), an empty aborted call,
    # supports and raw log-probs on every sampled id
    p0 = [5, 6, 7]
    s1 = [8, 9]
    c1 = Call(p0, s1, lp(2), "stop", 2, raw_log_probs=lp(2), support=[[8, 3], [9]])
    p1 = p0 + s1 + [10, 11]
    c2 = Call(p1, [12], lp(1), "length", 3, raw_log_probs=lp(1), support=[[12, 1]])
    c3 = Call([40, 41], [42, 43], lp(2), "stop", 3, raw_log_probs=lp(2), support=[[42], [43]])
    c4 = Call([40, 41, 42, 43, 44], [], [], "abort", 4, raw_log_probs=[], support=[])
    first = Session(
        task="gsm8k-17", group=1, sample=2, attempt=1, calls=[c1, c2, c3, c4],
        status=Status.TRUNCATED, reward=0.25, components={"format": 1.0}, detail="turn limit",
    )  # fmt: skip
    # session 1: routing, once over prompt + sampled ids, once over the sampled ids only
    q = [1, 2, 3, 4]
    r1 = routing(len(q) + 3)
    d1 = Call(q, [20, 21, 22], lp(3), "stop", 9, routed_experts=r1, raw_log_probs=lp(3),
              support=[[20], [21, 2], [22]])  # fmt: skip
    q2 = q + [20, 21, 22, 30]
    d2 = Call(q2, [31, 32], lp(2), "stop", 9, routed_experts=routing(2), raw_log_probs=lp(2),
              support=[[31], [32]])  # fmt: skip
    second = Session(task=5, calls=[d1, d2], status=Status.AGENT_ERROR, reward=-1.0)
    # session 2: an infrastructure failure with no reward
    third = Session(task=5, sample=1, calls=[Call([1, 2], [7], [-0.5])], status="infra_error")
    return [first, second, third]


def _same_session(a: Session, b: Session) -> None:
    for name in ("task", "group", "sample", "attempt", "status", "reward", "components", "detail"):
        assert getattr(a, name) == getattr(b, name), name
    assert len(a.calls) == len(b.calls)
    for k, (x, y) in enumerate(zip(a.calls, b.calls)):
        for name in ("prompt_ids", "sampled_ids", "behavior_log_probs"):
            _same(getattr(x, name), getattr(y, name), f"calls[{k}].{name}")
        assert (x.finish_reason, x.version) == (y.finish_reason, y.version), k
        for name in ("raw_log_probs", "routed_experts"):
            if getattr(x, name) is None:
                assert getattr(y, name) is None, f"calls[{k}].{name}"
            else:
                _same(getattr(x, name), getattr(y, name), f"calls[{k}].{name}")
        if x.support is None:
            assert y.support is None
        else:
            _same(list(x.support), list(y.support), f"calls[{k}].support")


def test_dew_sessions_round_trip_exactly() -> None:
    sessions = _sessions()
    rows = verl.to_verl(sessions)
    # one row per strict chain: session 0 has two chains
    assert len(rows) == 4
    chain = rows[0]
    assert chain["prompt_ids"] == [5, 6, 7]
    assert chain["response_ids"] == [8, 9, 10, 11, 12]
    assert chain["response_mask"] == [1, 1, 0, 0, 1]
    assert chain["response_logprobs"][2:4] == [0.0, 0.0]
    assert (
        chain["extra_fields"]["min_global_steps"],
        chain["extra_fields"]["max_global_steps"],
    ) == (2, 3)
    assert chain["reward_score"] == 0.25 and chain["routed_experts"] is None
    # the aborted call keeps its place: its prompt extends the second chain
    assert rows[1]["response_ids"] == [42, 43, 44] and rows[1]["response_mask"] == [1, 1, 0]
    routed = rows[2]["routed_experts"]
    assert routed.shape == (10, 3, 2) and routed.dtype == np.int16
    # the rows survive JSON (what a verl run stores), apart from the routing arrays
    for row in rows:
        text = json.dumps({k: v for k, v in row.items() if k != "routed_experts"})
        row.update(json.loads(text))
    back = verl.from_verl(rows)
    assert len(back) == 3 and all(t.dew for t in back)
    for original, trajectory in zip(sessions, back):
        _same_session(original, trajectory.session)
    again = verl.to_verl(back)
    for x, y in zip(rows, again):
        _same(x, y)


def test_written_rows_pack_like_the_sessions() -> None:
    sessions = _sessions()
    back = [t.session for t in verl.from_verl(verl.to_verl(sessions))]
    for truncation in ("mask", "score"):
        want = pack(sessions, width=16, truncation=truncation, support_capacity=12)
        got = pack(back, width=16, truncation=truncation, support_capacity=12)
        assert set(want) == set(got)
        for key in want:
            np.testing.assert_array_equal(want[key], got[key], err_msg=key)


def test_dew_record_mismatch_is_refused() -> None:
    rows = verl.to_verl(_sessions()[:1])
    rows[0]["response_mask"] = [1, 1, 0, 0, 0]
    rows[0]["response_logprobs"][4] = 0.0
    with pytest.raises(verl.VerlRowError, match=r"rows\[0\]\.extra_fields\.dew\.calls\[1\]"):
        verl.from_verl(rows)
    with pytest.raises(ValueError, match=r"sessions\[0\]\.calls: a session without calls"):
        verl.to_verl([Session(task=0)])


# ---------------------------------------------------------------- the gsm8k parquet


def _chat_tokenizer() -> ChatTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["You are a math expert. How many apples? #### 7"] * 5, trainer)
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return ChatTokenizer(tok, template, {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"})


def test_prompts_reads_verls_gsm8k_tool_agent_parquet() -> None:
    import pyarrow.parquet as pq

    path = FIXTURES / "gsm8k_tool_agent.parquet"
    table = pq.read_table(path).to_pylist()
    assert {r["agent_name"] for r in table} == {"tool_agent"}
    chat = _chat_tokenizer()
    prompts = Prompts(path=path, tokenizer=chat, max_prompt_len=512)
    assert len(prompts) == 4
    assert [prompts.text("ground_truth", i) for i in range(4)] == ["7", "60", "1000", "9"]
    assert {prompts.text("data_source", i) for i in range(4)} == {"openai/gsm8k"}
    extra = json.loads(prompts.text("extra_info", 2))
    assert extra["tools_kwargs"] == {
        "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1000"}}
    }
    assert extra["need_tools_kwargs"] is True and extra["index"] == 2
    # ability and agent_name are read and dropped
    assert set(prompts.arrays) == {"prompt", "prompt_length", *("data_source", "ground_truth")} | {
        "extra_info"
    }
    messages = [dict(m) for m in table[0]["prompt"]]
    ids = chat.encode(chat.render(messages, add_generation_prompt=True))
    length = int(prompts.arrays["prompt_length"][0])
    assert length == len(ids) and prompts.arrays["prompt"][0, -length:].tolist() == ids

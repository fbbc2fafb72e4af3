"""Trainer: accumulation, sharding, checkpoints, resume, logging and failure handling."""

from __future__ import annotations

import itertools
import json
import os

import jax
import numpy as np
import optax
import pytest

from dew import models
from dew.data import Dataset
from dew.data.chat import Role
from dew.objectives.lm import LMObjective
from dew.testing import tiny_decoder
from dew.trainer import NonFiniteLossError, Trainer
from dew.trainer import checkpoint as ckpt

SEQ = 8
VOCAB = 32


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, SEQ + 1)


def packed_batch(seed: int, rows: int = 8) -> dict[str, np.ndarray]:
    """Rows of two documents each plus trailing padding, with random roles."""
    rng = np.random.default_rng(seed)
    text = rng.integers(1, VOCAB, size=(rows, SEQ + 1)).astype(np.int32)
    seg = np.zeros((rows, SEQ + 1), np.int32)
    pos = np.zeros((rows, SEQ + 1), np.int32)
    for r in range(rows):
        cut = int(rng.integers(2, 5))
        end = int(rng.integers(cut + 2, SEQ + 2))
        seg[r, :cut] = 1
        seg[r, cut:end] = 2
        pos[r, :cut] = np.arange(cut)
        pos[r, cut:end] = np.arange(end - cut)
    roles = rng.choice([int(Role.USER), int(Role.ASSISTANT)], size=(rows, SEQ + 1)).astype(np.int8)
    return {"text": text, "text_segment_ids": seg, "text_positions": pos, "text_roles": roles}


def batches(seed: int, rows: int = 8):
    def train(partition, start=0):
        for i in itertools.count(start):
            yield packed_batch(seed * 1000 + i, rows)

    return Dataset(train=train, val=None, records=None, batch=rows)


def host(tree):
    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.array(jax.device_get(x), copy=True)

    return jax.tree.map(one, tree)


def test_loss_matches_numpy(model):
    obj = LMObjective(model, SEQ, loss_role=Role.ASSISTANT, ema_decay=None)
    variables = obj.init(jax.random.key(0))
    batch = packed_batch(3)
    loss_sum, weight, metrics = obj.loss(variables, batch, jax.random.key(1))
    logits = np.asarray(
        model.apply(
            variables,
            batch["text"][:, :-1],
            segment_ids=batch["text_segment_ids"][:, :-1],
            positions=batch["text_positions"][:, :-1],
        ),
        np.float64,
    )
    targets = batch["text"][:, 1:]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    seg = batch["text_segment_ids"]
    mask = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    mask &= batch["text_roles"][:, 1:] == int(Role.ASSISTANT)
    assert float(weight) == mask.sum() > 0
    np.testing.assert_allclose(float(loss_sum), nll[mask].sum(), rtol=1e-5)
    correct = (logits.argmax(-1) == targets)[mask].sum()
    assert float(metrics["accuracy_sum"]) == correct


def test_loss_role_needs_roles(model):
    obj = LMObjective(model, SEQ, loss_role=Role.ASSISTANT, ema_decay=None)
    batch = packed_batch(0)
    del batch["text_roles"]
    with pytest.raises(KeyError, match="text_roles"):
        obj.loss(obj.init(jax.random.key(0)), batch, jax.random.key(0))
    with pytest.raises(ValueError, match=r"text.*\[B, 10\]"):
        LMObjective(model, SEQ + 1).loss(obj.init(jax.random.key(0)), packed_batch(0), None)


def test_microbatches_equal_one_batch(model):
    """k microbatches give the update of one batch: normalised by the step's token count."""
    obj = LMObjective(model, SEQ, loss_role=Role.ASSISTANT, ema_decay=0.9)
    finals = []
    for k in (1, 2, 4):
        trainer = Trainer(obj, optax.adam(1e-2), key=jax.random.key(7), microbatches=k)
        state = trainer.fit(batches(1), steps=3)
        finals.append(host(state))
    for other in finals[1:]:
        for a, b in zip(jax.tree.leaves(finals[0].params), jax.tree.leaves(other.params)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
        for a, b in zip(jax.tree.leaves(finals[0].ema), jax.tree.leaves(other.ema)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # and not a mean of microbatch means: token counts differ between microbatches
    b = packed_batch(1000)
    halves = [{k: v[i::2] for k, v in b.items()} for i in range(2)]
    v0 = obj.init(jax.random.key(0))
    sums = [obj.loss(v0, h, None) for h in halves]
    assert float(sums[0][1]) != float(sums[1][1])


def test_fsdp_matches_replicated(model):
    obj = LMObjective(model, SEQ, ema_decay=None)
    a = Trainer(obj, optax.adam(1e-2), key=jax.random.key(3)).fit(batches(2), steps=2)
    t = Trainer(obj, optax.adam(1e-2), key=jax.random.key(3), fsdp=True)
    b = t.fit(batches(2), steps=2)
    emb = jax.tree.leaves(b.params)
    assert any(not x.sharding.is_fully_replicated for x in emb)
    for x, y in zip(jax.tree.leaves(host(a.params)), jax.tree.leaves(host(b.params))):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_resume_is_bit_identical_and_logs(model, tmp_path):
    obj = LMObjective(model, SEQ, ema_decay=0.99)
    full = Trainer(obj, optax.adamw(1e-2), key=jax.random.key(5)).fit(batches(4), steps=6)
    run = tmp_path / "run"
    t1 = Trainer(obj, optax.adamw(1e-2), key=jax.random.key(5), checkpoint_every=2,
                 tensorboard=True)  # fmt: skip
    t1.fit(batches(4), steps=3, run_dir=run, log_every=1)
    (events,) = os.listdir(run / "tensorboard")
    assert (
        events.startswith("events.out.tfevents.")
        and (run / "tensorboard" / events).stat().st_size > 100
    )
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2, 3]
    t2 = Trainer(obj, optax.adamw(1e-2), key=jax.random.key(5), checkpoint_every=2)
    resumed = t2.fit(batches(4), steps=6, run_dir=run, log_every=1)
    assert int(resumed.step) == 6 and int(resumed.updates) == 6
    for a, b in zip(jax.tree.leaves(host(full)), jax.tree.leaves(host(resumed))):
        np.testing.assert_array_equal(a, b)
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        assert {"loss", "tokens_per_s", "accuracy", "weight", "grad_norm"} <= set(r)
        assert np.isfinite(r["loss"])
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [3, 4, 6]
    meta = json.load(open(run / "checkpoints" / "step_00000006" / "meta.json"))
    assert meta["position"] == 6


def test_a_relative_run_dir_saves_and_resumes(model, tmp_path, monkeypatch):
    """``fit(run_dir="runs/x")`` from another working directory: the second call resumes
    from the first call's checkpoint instead of failing on orbax's absolute-path check."""
    obj = LMObjective(model, SEQ, ema_decay=None)
    monkeypatch.chdir(tmp_path)
    first = Trainer(obj, optax.sgd(0.1), key=jax.random.key(1), checkpoint_every=2)
    first.fit(batches(5), steps=2, run_dir="runs/x")
    assert [s for s, _ in ckpt.list_checkpoints("runs/x")] == [2]
    assert all(os.path.isabs(p) for _, p in ckpt.list_checkpoints("runs/x"))
    again = Trainer(obj, optax.sgd(0.1), key=jax.random.key(1), checkpoint_every=2)
    resumed = again.fit(batches(5), steps=3, run_dir="runs/x")
    assert int(resumed.step) == 3
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "runs" / "x")] == [2, 3]


def test_a_full_disk_is_one_sentence_and_keeps_the_last_checkpoint(model, tmp_path, monkeypatch):
    """The device fills while step 2 is saved: fit raises CheckpointSpaceError naming the
    directory and the intact step-1 checkpoint, and leaves no partial checkpoint behind."""
    import errno
    import re

    real = ckpt._checkpointer

    class Filling:
        def __init__(self):
            self.inner = real()

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def save(self, path, args):
            if "step_00000002" in path:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, "part"), "wb") as f:
                    f.write(b"half")
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.inner.save(path, args=args)

    monkeypatch.setattr(ckpt, "_checkpointer", Filling)
    obj = LMObjective(model, SEQ, ema_decay=None)
    run = tmp_path / "run"
    trainer = Trainer(obj, optax.sgd(0.1), key=jax.random.key(1), checkpoint_every=1)
    with pytest.raises(ckpt.CheckpointSpaceError) as caught:
        trainer.fit(batches(5), steps=3, run_dir=run)
    root = run / "checkpoints"
    assert str(caught.value) == (
        f"checkpoint of step 2: no space left on the device of {root}; the newest, "
        f"{root / 'step_00000001'}, is intact"
    )
    assert sorted(os.listdir(root)) == ["step_00000001"]  # no .tmp- leftovers
    monkeypatch.setattr(ckpt, "_checkpointer", real)
    restored = ckpt.latest(run, expected_leaves=None)
    assert restored is not None and restored.step == 1
    assert not ckpt._out_of_space(ValueError("shape mismatch"))
    assert ckpt._out_of_space(RuntimeError("RESOURCE_EXHAUSTED: Error writing local file"))
    assert re.search("no space", str(caught.value))


def test_corrupt_checkpoint_is_skipped(model, tmp_path):
    obj = LMObjective(model, SEQ, ema_decay=None)
    run = tmp_path / "run"
    Trainer(obj, optax.sgd(0.1), key=jax.random.key(1), checkpoint_every=1).fit(
        batches(5), steps=3, run_dir=run
    )
    state_dir = run / "checkpoints" / "step_00000003" / "state"
    # the largest file holds array data: one flipped byte there must not pass unnoticed
    newest = max((p for p in state_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    (run / "checkpoints" / "step_00000004").mkdir()  # a partial directory, no meta
    with pytest.warns(RuntimeWarning) as caught:
        restored = ckpt.latest(run)
    assert restored is not None and restored.step == 2
    text = " ".join(str(w.message) for w in caught)
    assert "step_00000003" in text and "checksum" in text and "step_00000004" in text
    assert newest.relative_to(state_dir.parent).as_posix() in text
    with pytest.warns(RuntimeWarning) as caught:
        state = Trainer(obj, optax.sgd(0.1), key=jax.random.key(1)).fit(
            batches(5), steps=4, run_dir=run
        )
    assert int(state.step) == 4
    assert any("checksum" in str(w.message) for w in caught)


def test_non_finite_loss_names_step_and_saves_nothing(model, tmp_path):
    good = batches(6)

    class Poisoned(LMObjective):
        def loss(self, variables, batch, key, reference=None):
            ls, w, m = super().loss(variables, batch, key, reference)
            return ls * batch["scale"][0], w, m

    def poisoned(partition, start=0):
        for i, b in enumerate(good.train(partition, start), start=start):
            scale = np.inf if i == 3 else 1.0  # the 4th batch -> step 4
            yield {**b, "scale": np.full((8,), scale, np.float32)}

    run = tmp_path / "run"
    objective = Poisoned(model, SEQ, ema_decay=None)
    trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(0), checkpoint_every=2)
    with pytest.raises(NonFiniteLossError, match="step 4"):
        trainer.fit(Dataset(train=poisoned, batch=8), steps=6, run_dir=run)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]


def test_rollout_hook_sees_current_variables(model):
    obj = LMObjective(model, SEQ, ema_decay=None)
    seen = []

    def rollout(variables, batch, key):
        seen.append(float(np.asarray(jax.tree.leaves(variables)[0]).sum()))
        return {**batch, "text": np.asarray(batch["text"])}

    Trainer(obj, optax.sgd(0.5), key=jax.random.key(0), rollout=rollout).fit(batches(7), steps=3)
    assert len(seen) == 3 and len(set(seen)) == 3


def test_guide_sft_example():
    """The guide's SFT example, with the local test tokenizer in place of the TinyStories one."""
    from dew.data.chat.template import ChatTokenizer

    fixtures = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures")
    tokenizer = ChatTokenizer.load(os.path.join(fixtures, "chat", "tokenizer"))
    model = models.build("causal_transformer", vocab_size=tokenizer.tokenizer.get_vocab_size(),
                         emb_features=16, num_layers=1, num_heads=2, mlp_features=32,
                         max_seq_len=64)  # fmt: skip
    lm_state_params = LMObjective(model, seq_len=8).init(jax.random.key(1))

    prompt = tokenizer.encode("Tom had a red ball.")
    response = tokenizer.encode(" He kicked it to his dog.")
    row = np.array(prompt + response, dtype=np.int32)
    roles = np.array([Role.USER] * len(prompt) + [Role.ASSISTANT] * len(response), dtype=np.int8)
    sft_batch = {"text": np.tile(row, (8, 1)), "text_roles": np.tile(roles, (8, 1))}
    sft_data = Dataset(
        train=lambda partition: itertools.repeat(sft_batch),
        val=None,
        records=8,
        batch=8,
    )
    sft_objective = LMObjective(
        model,
        seq_len=len(row) - 1,
        pretrained=lm_state_params,
        loss_role=Role.ASSISTANT,
        ema_decay=None,
    )
    before = sft_objective.loss(lm_state_params, sft_batch, None)
    sft_state = Trainer(
        sft_objective,
        optax.adamw(1e-3),
        key=jax.random.key(2),
    ).fit(sft_data, steps=20, log_every=10)
    after = sft_objective.loss(sft_state.params, sft_batch, None)
    assert int(sft_state.step) == 20 and sft_state.ema is None
    # the loss counts the response's targets only (8 rows)
    assert float(before[1]) == float(after[1]) == 8 * len(response)
    assert float(after[0]) < float(before[0])


def test_rows_not_dividing_devices_are_replicated(model):
    """Six rows on four devices train (replicated) like six rows on one device."""
    obj = LMObjective(model, SEQ, ema_decay=None)
    a = Trainer(obj, optax.adam(1e-2), key=jax.random.key(4)).fit(batches(9, rows=6), steps=2)
    one = Trainer(obj, optax.adam(1e-2), key=jax.random.key(4), devices=jax.devices()[:1])
    b = one.fit(batches(9, rows=6), steps=2)
    for x, y in zip(jax.tree.leaves(host(a.params)), jax.tree.leaves(host(b.params))):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    with pytest.raises(
        ValueError, match=r"batch\['text'\]: 6 rows do not split into 4 microbatches"
    ):
        Trainer(obj, optax.adam(1e-2), key=jax.random.key(4), microbatches=4).fit(
            batches(9, rows=6), steps=1
        )


def test_positions_follow_segments_when_absent(model):
    from dew.objectives.scoring import positions_from_segments

    batch = packed_batch(12)
    np.testing.assert_array_equal(
        np.asarray(positions_from_segments(batch["text_segment_ids"]))[
            batch["text_segment_ids"] > 0
        ],
        batch["text_positions"][batch["text_segment_ids"] > 0],
    )
    obj = LMObjective(model, SEQ, ema_decay=None)
    v = obj.init(jax.random.key(0))
    with_pos = obj.loss(v, batch, None)[0]
    without = obj.loss(v, {k: x for k, x in batch.items() if k != "text_positions"}, None)[0]
    np.testing.assert_allclose(float(with_pos), float(without), rtol=1e-6)

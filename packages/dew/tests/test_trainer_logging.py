"""Trackers and progress: JSON lines, TensorBoard (tensorboardX, read back by TensorBoard),
W&B offline, MLflow file store, plain log lines off a terminal, no step logged twice after a
resume, and a progress bar that never waits for the step it just dispatched."""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import struct
import time

import jax
import numpy as np
import optax
import pytest

import dew.trainer.fit_run as fit_run_module
from dew import models
from dew.data import Dataset
from dew.objectives.lm import LMObjective
from dew.progress import Progress
from dew.testing import TerminalStream
from dew.trainer import Trainer
from dew.trainer.tracker import JsonlTracker, MlflowTracker, TensorBoardTracker, WandbTracker

SEQ, VOCAB = 8, 32


@pytest.fixture(scope="module")
def objective():
    model = models.build("causal_transformer", vocab_size=VOCAB, emb_features=16, num_layers=1,
                         num_heads=2, mlp_features=32, max_seq_len=SEQ + 1)  # fmt: skip
    return LMObjective(model, SEQ)


def data(rows: int = 4) -> Dataset:
    def train(partition, start=0):
        for i in itertools.count(start):
            rng = np.random.default_rng(i)
            text = rng.integers(1, VOCAB, size=(rows, SEQ + 1)).astype(np.int32)
            yield {"text": text, "text_segment_ids": np.ones_like(text),
                   "text_positions": np.tile(np.arange(SEQ + 1, dtype=np.int32), (rows, 1))}  # fmt: skip

    return Dataset(train=train, val=None, records=None, batch=rows)


def tensorboard_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``logdir``, read by TensorBoard's own event accumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_read_back_by_tensorboard(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    tracker.write({"step": 7, "loss": 1.5, "val/perplexity": 4.25, "note": "text"})
    tracker.write({"step": 8, "loss": 1.25})
    tracker.close()
    assert tensorboard_scalars(tmp_path) == {
        "loss": [(7, 1.5), (8, 1.25)],
        "val/perplexity": [(7, 4.25)],
    }


def test_jsonl_tracker_appends_and_drops_steps_after_a_resume(tmp_path):
    path = tmp_path / "m.jsonl"
    for step in (1, 2, 3):
        t = JsonlTracker(path)
        t.write({"step": step, "loss": float("nan") if step == 2 else 0.5})
        t.close()
    with open(path, "a") as f:
        f.write('{"step": 4, "lo')  # a line cut by a kill
    t = JsonlTracker(path, resume_step=2)
    t.write({"step": 3, "loss": 0.25})
    t.close()
    rows = [json.loads(x) for x in open(path)]
    assert rows == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": None},
                    {"step": 3, "loss": 0.25}]  # fmt: skip
    text = path.read_text()
    assert "NaN" not in text and '"nan"' not in text  # strict JSON, numeric column kept


def test_resumed_fit_says_so_logs_lines_and_never_logs_a_step_twice(objective, tmp_path, capsys):
    """Off a terminal every logged step prints a plain line. A run killed after logging step
    4 but saving only step 3 resumes from 3, says so, and metrics.jsonl and TensorBoard keep
    one record per step."""
    import shutil

    run = tmp_path / "run"

    def trainer():
        return Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), checkpoint_every=3,
                       trackers=["tensorboard"])  # fmt: skip

    trainer().fit(data(), steps=4, log_every=1, run_dir=run)
    first = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in first] == [f"dew: step {i}/4" for i in (1, 2, 3, 4)]
    # the first line has no rate yet (its time is compilation); the others give an ETA
    assert re.search(r"  loss \S+  tokens/s \S+  ETA \?$", first[0]), first[0]
    assert all(re.search(r"  loss \S+  tokens/s \S+  ETA \d+:\d\d:\d\d$", x) for x in first[1:])
    shutil.rmtree(run / "checkpoints" / "step_00000004")  # the kill: step 4 was never saved
    trainer().fit(data(), steps=6, log_every=1, run_dir=run)
    second = capsys.readouterr().err.splitlines()
    assert second[0] == f"dew: resuming from step 3 ({run})"
    assert [line.split("  ")[0] for line in second[1:]] == [f"dew: step {i}/6" for i in (4, 5, 6)]
    steps = [json.loads(x)["step"] for x in open(run / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in tensorboard_scalars(run / "tensorboard")["loss"]] == [1, 2, 3, 4, 5, 6]


def test_progress_bar_does_not_wait_for_the_step_it_just_dispatched(objective, monkeypatch):
    """With the bar on and nothing to log, a step's metrics reach the host only after the
    next step is dispatched (the one-step lag), except at the last step."""
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), progress=True)
    compiled = trainer._step()
    dispatched: list[int] = []
    step_of: dict[int, int] = {}

    def counting(state, batch):
        state, metrics = compiled(state, batch)
        dispatched.append(len(dispatched) + 1)
        step_of[id(metrics)] = dispatched[-1]
        return state, metrics

    trainer._compiled_step = counting
    fetches: list[tuple[int, int]] = []

    def to_host(metrics):
        fetches.append((step_of[id(metrics)], len(dispatched)))
        return jax.device_get(metrics)

    monkeypatch.setattr(fit_run_module, "_to_host", to_host)
    trainer.fit(data(), steps=6)
    assert [step for step, _ in fetches] == [1, 2, 3, 4, 5, 6]  # the bar saw every loss
    waited = [step for step, latest in fetches if step == latest]
    assert waited == [6], fetches


def test_progress_draws_a_tqdm_bar_on_a_terminal():
    stream = TerminalStream(True)
    bar = Progress(10, stream=stream)
    bar.update(5, 0.25)
    bar.log({"step": 5, "loss": 0.25})  # no plain lines under a bar
    bar.close()
    text = stream.getvalue()
    assert "5/10" in text and "loss=0.25" in text and "dew: step" not in text


def test_the_eta_leaves_out_the_time_before_the_first_logged_step(monkeypatch):
    """A resumed run spends a minute restoring and compiling before step 11, then 1 s a
    step: the ETA at step 12 is 88 s, not (61 + 1) s a step times 88."""
    import dew.progress as progress_module

    clock = iter([0.0, 61.0, 62.0, 63.0])
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    stream = TerminalStream(False)
    bar = Progress(100, start=10, stream=stream)
    for step in (11, 12, 13):
        bar.log({"step": step})
    lines = stream.getvalue().splitlines()
    assert lines == ["dew: step 11/100  ETA ?", "dew: step 12/100  ETA 0:01:28",
                     "dew: step 13/100  ETA 0:01:27"]  # fmt: skip


def test_plain_log_lines_off_a_terminal():
    stream = TerminalStream(False)
    bar = Progress(100, start=0, stream=stream)
    bar.update(40, 2.0)
    bar.log({"step": 39, "loss": 2.0})
    bar.log({"step": 40, "loss": 2.3141, "tokens_per_s": 12345.0, "learning_rate": 3e-4})
    bar.message("dew: resuming from step 10")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"dew: step 40/100  loss 2\.314  tokens/s 1\.23e\+04  lr 0\.0003  ETA \d+:\d\d:\d\d",
        lines[1],
    ), lines
    assert lines[2] == "dew: resuming from step 10"
    quiet = TerminalStream(False)
    off = Progress(10, stream=quiet, enabled=False)
    off.log({"step": 1, "loss": 1.0})
    off.message("x")
    assert quiet.getvalue() == ""


def read_wandb_history(run_file: str) -> list[dict[str, str]]:
    """History rows of an offline W&B run file: a LevelDB-style log (7-byte ``:W&B`` header,
    32 KiB blocks, records ``crc u32 | length u16 | type u8 | data``) of ``Record`` protobufs
    (wandb/sdk/internal/datastore.py in wandb 0.18, wandb/proto/wandb_internal.proto)."""
    from wandb.proto import wandb_internal_pb2

    data = open(run_file, "rb").read()
    assert data[:4] == b":W&B"
    block, at, pending, rows = 32768, 7, b"", []
    while at + 7 <= len(data):
        if block - at % block < 7:
            at += block - at % block
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + 7])
        at += 7
        pending += data[at : at + length]
        at += length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): i.value_json
                             for i in record.history.item})  # fmt: skip
    return rows


def test_wandb_offline_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    # wandb starts a service process; on a loaded 2-core CI machine it can need more than
    # its default 90 s to answer.
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "600")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracker = WandbTracker(tmp_path)
    tracker.write({"step": 1, "loss": 0.5, "val/perplexity": 2.0})
    tracker.write({"step": 2, "loss": 0.25})
    tracker.close()
    from google.protobuf.message import DecodeError

    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert tracker.run_id in run_file
    expected = [{"_step": "1", "loss": "0.5", "val/perplexity": "2"},
                {"_step": "2", "loss": "0.25"}]  # fmt: skip
    # the file is written by wandb's service process, which on a loaded machine may still
    # be appending the history after finish() returned: read until both rows are there
    deadline = time.monotonic() + 120
    while True:
        try:
            rows = [{k: v for k, v in r.items() if not k.startswith("_") or k == "_step"}
                    for r in read_wandb_history(run_file)]  # fmt: skip
        except (DecodeError, struct.error):  # a record still being written
            rows = []
        if len(rows) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows == expected
    assert open(tmp_path / "wandb_run_id").read() == tracker.run_id


def test_mlflow_file_store_continues_the_run_after_a_resume(tmp_path):
    config = {"kind": "lm", "run": {"steps": 3, "run_dir": str(tmp_path)},
              "optimizer": {"name": "adamw", "learning_rate": 0.001}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    first = MlflowTracker(tmp_path)
    first.write({"step": 1, "loss": 0.5, "val/perplexity": 2.0})
    first.close()
    again = MlflowTracker(tmp_path, resume_step=1)
    again.write({"step": 2, "loss": 0.25})
    again.close()
    assert again.run_id == first.run_id
    assert os.path.isdir(tmp_path / "mlruns")
    history = again.client.get_metric_history(again.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    (ppl,) = again.client.get_metric_history(again.run_id, "val/perplexity")
    assert (ppl.step, ppl.value) == (1, 2.0)
    # the resolved config is the run's params, logged once
    params = again.client.get_run(again.run_id).data.params
    assert params == {"kind": "lm", "run.steps": "3", "run.run_dir": str(tmp_path),
                      "optimizer.name": "adamw", "optimizer.learning_rate": "0.001"}  # fmt: skip


def test_unknown_tracker_names_are_refused(objective, tmp_path):
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), trackers=["neptune"])
    with pytest.raises(
        ValueError,
        match="trackers: expected one of jsonl, tensorboard, wandb, mlflow or an object, got 'neptune'",
    ):
        trainer.fit(data(), steps=1, run_dir=tmp_path)
    with pytest.raises(
        TypeError,
        match="trackers: expected a name or an object with write\\(\\) and close\\(\\), got int",
    ):
        Trainer(objective, optax.adam(1e-2), key=jax.random.key(0), trackers=[3]).fit(
            data(), steps=1
        )

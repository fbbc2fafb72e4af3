"""Metric trackers: where the Trainer's records go.

A tracker is any object with ``write(record)`` and ``close()`` (the ``Tracker`` protocol);
``record`` is ``{"step": int, name: float, ...}``. ``Trainer(trackers=[...])`` takes tracker
objects or names, the names made when ``fit`` knows the run directory and the step it resumes
from:

==================  =====================================================================
``"jsonl"``         ``JsonlTracker``: ``run_dir/metrics.jsonl``, one JSON object a line (the
                    default; always on when ``fit`` has a run directory)
``"tensorboard"``   ``TensorBoardTracker``: event files under ``run_dir/tensorboard``
                    written by ``tensorboardX``
``"wandb"``         ``WandbTracker``: Weights & Biases (``wandb`` extra), offline unless
                    ``WANDB_MODE`` says otherwise, files under ``run_dir``
``"mlflow"``        ``MlflowTracker``: MLflow (``mlflow`` extra), a file store under
                    ``run_dir/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set
==================  =====================================================================

A resumed run restarts from its checkpoint's step ``N``, so records of later steps written
before the interruption are dropped: ``metrics.jsonl`` is rewritten without them (never a
step twice), TensorBoard purges them (``purge_step``), W&B and MLflow continue the same run
(its id kept in the run directory).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from dew.checks import is_real
from dew.files import write_text

TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")


@runtime_checkable
class Tracker(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _plain(value: Any) -> Any:
    """A JSON value: a non-finite float becomes ``null`` (strict JSON has no NaN, and a
    string would turn a numeric column into text for every reader)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields of ``record`` other than ``step``."""
    return {
        name: float(value) for name, value in record.items() if name != "step" and is_real(value)
    }


def _read_id(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


class JsonlTracker:
    """Appends records to ``path`` (one JSON object a line), flushed after each; a NaN or
    infinite value is written as ``null``.

    ``resume_step``: drop records of later steps already in the file (written by a run that
    stopped after its last checkpoint), so the file never holds a step twice.
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if resume_step is not None and os.path.exists(self.path):
            self._truncate(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _truncate(self, step: int) -> None:
        keep = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if isinstance(record, dict) and int(record.get("step", 0)) <= step:
                    keep.append(json.dumps(record) + "\n")
        write_text(self.path, "".join(keep))

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardTracker:
    """Every numeric field of a record as a TensorBoard scalar under ``logdir`` (tensorboardX).

    ``resume_step``: TensorBoard discards this directory's events after that step.
    """

    def __init__(self, logdir: str | os.PathLike[str], resume_step: int | None = None) -> None:
        from tensorboardX import SummaryWriter

        purge = resume_step + 1 if resume_step else None
        self._writer = SummaryWriter(os.fspath(logdir), purge_step=purge, flush_secs=5)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for name, value in scalars(record).items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """Weights & Biases (``pip install 'dew[wandb]'``): offline by default, under ``run_dir``.

    The run id is kept in ``run_dir/wandb_run_id`` so a resumed run continues the same run.
    ``WANDB_MODE=online`` (and a login) sends it to a server instead.
    """

    def __init__(self, run_dir: str | os.PathLike[str], project: str = "dew",
                 mode: str | None = None, resume_step: int | None = None) -> None:  # fmt: skip
        try:
            import wandb
        except ImportError as err:
            raise ImportError(
                "trackers: 'wandb' needs the optional extra (pip install 'dew[wandb]')"
            ) from err
        run_dir = os.fspath(run_dir)
        os.makedirs(run_dir, exist_ok=True)
        id_path = os.path.join(run_dir, "wandb_run_id")
        run_id = _read_id(id_path) or uuid.uuid4().hex[:12]
        write_text(id_path, run_id)
        self._run = wandb.init(
            project=project,
            dir=run_dir,
            id=run_id,
            resume="allow",
            mode=mode or os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            reinit="create_new",
        )
        self.run_id = run_id

    def write(self, record: dict[str, Any]) -> None:
        self._run.log(scalars(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self._run.finish()


def config_params(run_dir: str, limit: int = 500) -> dict[str, str]:
    """``run_dir/config.json`` (what ``dew train`` resolved) flattened to dotted keys with
    string values cut at ``limit`` characters; empty when there is no such file."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                walk(inner, f"{key}.{name}" if key else str(name))
        else:
            out[key] = str(value)[:limit]

    walk(config, "")
    return out


class MlflowTracker:
    """MLflow (``pip install 'dew[mlflow]'``): a file store at ``run_dir/mlruns`` by default.

    The run id is kept in ``run_dir/mlflow_run_id`` so a resumed run continues the same run.
    A new run logs ``run_dir/config.json`` (the config ``dew train`` resolved) as its
    params. MLflow 3 opens a file store only with ``MLFLOW_ALLOW_FILE_STORE=true``: set it
    to read ``run_dir/mlruns`` with ``mlflow ui --backend-store-uri file:RUN_DIR/mlruns``.
    """

    def __init__(self, run_dir: str | os.PathLike[str], experiment: str = "dew",
                 tracking_uri: str | None = None, resume_step: int | None = None) -> None:  # fmt: skip
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise ImportError(
                "trackers: 'mlflow' needs the optional extra (pip install 'dew[mlflow]')"
            ) from err
        run_dir = os.path.abspath(os.fspath(run_dir))
        os.makedirs(run_dir, exist_ok=True)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            uri = "file:" + os.path.join(run_dir, "mlruns")
            # MLflow 3 keeps the file store working only when asked to
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else self.client.create_experiment(experiment)
        )
        id_path = os.path.join(run_dir, "mlflow_run_id")
        run_id = _read_id(id_path)
        if run_id is None:
            run_id = self.client.create_run(experiment_id).info.run_id
            write_text(id_path, run_id)
            params = config_params(run_dir)
            if params:
                from mlflow.entities import Param

                items = [Param(k, v) for k, v in sorted(params.items())]
                for start in range(0, len(items), 100):  # MLflow takes 100 params a batch
                    self.client.log_batch(run_id, params=items[start : start + 100])
        self.run_id = run_id
        self.tracking_uri = uri

    def write(self, record: dict[str, Any]) -> None:
        import time

        from mlflow.entities import Metric

        step = int(record.get("step", 0))
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, value in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def make_tracker(spec: Any, run_dir: str, resume_step: int | None) -> Tracker:
    """A tracker from a name of ``TRACKERS`` (made for ``run_dir``) or a ready object."""
    if isinstance(spec, str):
        if spec == "jsonl":
            return JsonlTracker(os.path.join(run_dir, "metrics.jsonl"), resume_step)
        if spec == "tensorboard":
            return TensorBoardTracker(os.path.join(run_dir, "tensorboard"), resume_step)
        if spec == "wandb":
            return WandbTracker(run_dir, resume_step=resume_step)
        if spec == "mlflow":
            return MlflowTracker(run_dir, resume_step=resume_step)
        raise ValueError(
            f"trackers: expected one of {', '.join(TRACKERS)} or an object, got {spec!r}"
        )
    if not isinstance(spec, Tracker):
        raise TypeError(
            f"trackers: expected a name or an object with write() and close(), got "
            f"{type(spec).__name__}"
        )
    return spec


__all__ = ["TRACKERS", "JsonlTracker", "MlflowTracker", "TensorBoardTracker", "Tracker",
           "WandbTracker", "make_tracker", "scalars"]  # fmt: skip

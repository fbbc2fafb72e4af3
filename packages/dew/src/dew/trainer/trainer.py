"""The Trainer: one compiled, donated update per step over a data-parallel mesh.

``Trainer(objective, optimizer, key=..., rollout=None)`` then ``fit(data, steps=N, ...)``.
See ``dew.trainer.step`` for the update, ``dew.trainer.checkpoint`` for the checkpoint format
and ``dew.mesh`` for the shardings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax

from dew.compile_cache import configure_default
from dew.data.dataset import Dataset, Partition
from dew.mesh import data_mesh, global_batch, replicated, state_shardings
from dew.objectives.base import (
    Objective,
    release_pretrained,
    starts_from_variables,
    validate_ema_decay,
)
from dew.progress import Progress
from dew.rollouts.protocol import Rollout
from dew.trainer import checkpoint as ckpt
from dew.trainer import frozen
from dew.trainer.fit_run import FitRun, NonFiniteLossError
from dew.trainer.signals import StopRequest, TrainingInterrupted
from dew.trainer.state import TrainState, take_over
from dew.trainer.step import make_init, make_step
from dew.trainer.tracker import Tracker, make_tracker


def _find_learning_rate(opt_state: Any) -> Any:
    """The ``learning_rate`` of an ``optax.inject_hyperparams`` state, if there is one."""
    stack = [opt_state]
    while stack:
        node = stack.pop()
        hyper = getattr(node, "hyperparams", None)
        if isinstance(hyper, Mapping) and "learning_rate" in hyper:
            return hyper["learning_rate"]
        if isinstance(node, tuple | list):
            stack.extend(node)
    return None


class Trainer:
    """Runs an objective's updates.

    Args:
      objective: an ``dew.objectives.Objective``.
      optimizer: an ``optax.GradientTransformation`` applied to ``variables["params"]``.
      key: a PRNG key; split into the initialisation key, the step keys and rollout keys.
      rollout: optional ``dew.rollouts.protocol.Rollout``, a host function
        ``(variables, batch, key) -> batch`` called before each compiled update with the
        current variables (valid until that update donates them). When it has an
        ``at_step(step, updates)`` method, that is called first with the step being
        attempted and the optimizer updates committed so far.
      microbatches: split each step's batch into this many microbatches (gradient
        accumulation normalised by the step's total weight).
      fsdp: shard parameters and optimizer state over the devices instead of replicating them.
      devices: the devices of the mesh (default: all devices of all processes).
      checkpoint_every: save every this many steps when ``fit`` has a ``run_dir`` (the last
        step is always saved).
      keep_checkpoints: how many checkpoints to keep.
      tensorboard: also write TensorBoard scalars under ``run_dir/tensorboard`` (the same as
        adding ``"tensorboard"`` to ``trackers``).
      trackers: where records go besides ``run_dir/metrics.jsonl`` (always written when
        ``fit`` has a run directory): names (``"tensorboard"``, ``"wandb"``, ``"mlflow"``)
        made for the run directory, or objects with ``write(record)`` and ``close()``
        (``dew.trainer.tracker``).
      learning_rate: a float or schedule, only for logging when the optimizer does not expose
        one through ``optax.inject_hyperparams``.
      progress: draw a progress bar (``None``: only when stderr is a terminal; otherwise a
        plain line on stderr each time metrics are logged). The bar shows the previous
        step's loss, which the one-step metrics lag has already brought to the host, so
        drawing it never waits for the device. The plain line shows the objective's
        ``key_metrics`` (metric names; default ``("loss",)``) and every validation metric.
      evaluator: optional host function ``variables -> {name: float}`` run whenever the
        validation is due (``fit(eval_every=...)``), after the objective's own ``evaluate``;
        its metrics join the record as ``val/<name>`` (e.g. a held-out reward of greedy
        completions, ``dew.recipes.reward_eval.HeldOutReward``).
      consume_pretrained: hand the objective's starting variables (its ``pretrained``) to
        the first state instead of copying them, so a run holds one copy of the weights, not
        two. The first ``initial_state()`` (the one ``fit`` makes when given no state) takes
        the arrays as they are wherever they already lie as the state keeps them (otherwise
        it moves them and deletes the originals), then drops the objective's references
        (``dew.objectives.base.release_pretrained``); the first step donates the state, which
        deletes those buffers for anyone still holding them. A second ``initial_state()``
        raises: pass the first state to ``fit(state=...)`` instead. Leave it off (the
        default) when anything reads the pretrained arrays after the Trainer starts (a
        caller reusing them, a KL-in-reward rollout's reference): then the state gets its
        own copy. Without ``pretrained`` it changes nothing.

    Making a Trainer turns on JAX's persistent compilation cache (``dew.compile_cache``)
    unless this process already chose (``dew.compile_cache.configure``, the ``dew`` command
    line) or ``DEW_COMPILE_CACHE=0`` says no.
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: optax.GradientTransformation,
        *,
        key: jax.Array,
        rollout: Rollout | None = None,
        microbatches: int = 1,
        fsdp: bool = False,
        devices: list[jax.Device] | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        tensorboard: bool = False,
        trackers: Sequence[Any] = (),
        learning_rate: float | Callable[[int], Any] | None = None,
        progress: bool | None = None,
        evaluator: Callable[[Any], Mapping[str, float]] | None = None,
        consume_pretrained: bool = False,
    ) -> None:
        if not hasattr(objective, "init") or not hasattr(objective, "loss"):
            raise TypeError(
                f"objective: expected init() and loss(), got {type(objective).__name__}"
            )
        validate_ema_decay(getattr(objective, "ema_decay", None), field="objective.ema_decay")
        if not isinstance(microbatches, int) or microbatches < 1:
            raise ValueError(f"microbatches: expected an integer >= 1, got {microbatches!r}")
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(f"checkpoint_every: expected None or >= 1, got {checkpoint_every!r}")
        configure_default()  # the persistent compile cache, unless an entry point chose
        self.objective = objective
        self.optimizer = optimizer
        self.rollout = rollout
        self.microbatches = microbatches
        self.fsdp = fsdp
        self.checkpoint_every = checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self.tensorboard = tensorboard
        self.trackers = list(trackers)
        if "tensorboard" in self.trackers:
            self.tensorboard = True
        self.learning_rate = learning_rate
        self.progress = progress
        self.evaluator = evaluator
        self.consume_pretrained = bool(consume_pretrained)
        self._took_pretrained = False
        self.mesh = data_mesh(devices)
        if isinstance(key, jax.Array) and not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.wrap_key_data(key)
        self._init_key, self._rng, self._rollout_key = jax.random.split(key, 3)
        self._init_fn = make_init(objective, optimizer)
        self._step_fn = make_step(objective, optimizer, microbatches)
        self._abstract: TrainState | None = None
        self._shardings: Any = None
        self._compiled_step: Any = None
        self._compiled_eval: Any = None

    # ----------------------------------------------------------------------------- state
    def _variables(self) -> Any:
        if starts_from_variables(self.objective):
            return self.objective.init(self._init_key)
        return jax.jit(self.objective.init)(self._init_key)

    def _ensure_shardings(self, variables: Any) -> None:
        if self._shardings is None:
            self._abstract = jax.eval_shape(self._init_fn, variables, self._rng)
            self._shardings = state_shardings(self._abstract, self.mesh, self.fsdp)

    def initial_state(self) -> TrainState:
        """A fresh TrainState: the objective's variables, optimizer state, EMA and the RNG.

        With ``consume_pretrained`` and an objective that starts from given variables, the
        state owns those arrays (no copy) and the objective no longer refers to them; a
        second call then raises ``ValueError``. Otherwise the state gets its own copy.
        """
        if self._took_pretrained:
            raise ValueError(
                "Trainer(consume_pretrained=True): the first initial_state() took the "
                "objective's pretrained variables; pass that state to fit(state=...) or build "
                "a new objective to start again"
            )
        taking = self.consume_pretrained and starts_from_variables(self.objective)
        variables = self._variables()
        self._ensure_shardings(variables)
        if not taking:
            init = jax.jit(self._init_fn, out_shardings=self._shardings)
            return init(variables, self._rng)
        state = take_over(self._init_fn, variables, self._rng, self._shardings)
        release_pretrained(self.objective)
        self._took_pretrained = True
        return state

    def _step(self) -> Any:
        if self._compiled_step is None:
            self._compiled_step = jax.jit(
                self._step_fn,
                out_shardings=(self._shardings, replicated(self.mesh)),
                donate_argnums=(0,),
            )
        return self._compiled_step

    # ----------------------------------------------------------------------------- eval
    def evaluate(
        self, variables: Any, data: Dataset, key: jax.Array | None = None
    ) -> dict[str, float]:
        """Validation metrics over every batch of ``data.val`` (empty if there is none), and
        the ``evaluator``'s metrics when it is set."""
        out = self._evaluate_objective(variables, data, key)
        if self.evaluator is not None:
            out.update({name: float(v) for name, v in self.evaluator(variables).items()})
        return out

    def _evaluate_objective(
        self, variables: Any, data: Dataset, key: jax.Array | None
    ) -> dict[str, float]:
        fn = getattr(self.objective, "evaluate", None)
        partition = Partition(jax.process_index(), jax.process_count())
        batches = data.validation(partition)
        if fn is None or batches is None:
            return {}
        if self._compiled_eval is None:
            self._compiled_eval = jax.jit(fn, out_shardings=replicated(self.mesh))
        key = self._rollout_key if key is None else key
        totals: dict[str, float] = {}
        for i, local in enumerate(batches):
            batch = global_batch(local, self.mesh)
            out = jax.device_get(self._compiled_eval(variables, batch, jax.random.fold_in(key, i)))
            for name, value in out.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        summarize = getattr(self.objective, "summarize_evaluation", None)
        if summarize is not None:
            return dict(summarize(totals))
        weight = totals.pop("weight", 0.0)
        return {k: (v / weight if weight else float("nan")) for k, v in totals.items()}

    # ----------------------------------------------------------------------------- fit
    def fit(
        self,
        data: Dataset,
        steps: int,
        *,
        log_every: int | None = None,
        eval_every: int | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        state: TrainState | None = None,
        resume_from: str | os.PathLike[str] | None = None,
    ) -> TrainState:
        """Train until ``state.step == steps`` and return the final state.

        With ``run_dir``: resume from its newest valid checkpoint when it has one, write
        ``metrics.jsonl`` every ``log_every`` steps, and checkpoints every
        ``checkpoint_every`` steps and at the end. ``state`` starts from a given state
        instead of ``initial_state()`` (a checkpoint in ``run_dir`` wins). ``resume_from``
        names one checkpoint directory to start from instead of ``run_dir``'s newest (its
        state, step and data position); checkpoints ``run_dir`` holds beyond its step are
        replaced as training reaches them.

        Raises ``NonFiniteLossError`` naming the step whose loss was not finite; that step
        is not saved, so the newest checkpoint stays the last good one. On SIGINT or SIGTERM
        the step in flight finishes, a checkpoint of it is saved (with ``run_dir``) and
        ``TrainingInterrupted`` is raised; running ``fit`` again resumes from there. On a
        multi-process run a signal to any one process stops every process after the same
        step (``dew.trainer.signals``), all saving that step's checkpoint together.
        """
        if not isinstance(data, Dataset):
            raise TypeError(f"data: expected a dew.data.Dataset, got {type(data).__name__}")
        steps = int(steps)
        lead = jax.process_index() == 0
        partition = Partition(jax.process_index(), jax.process_count())
        state, position = self._starting_state(state, run_dir, resume_from)
        run_dir = None if run_dir is None else os.fspath(run_dir)
        start = int(jax.device_get(state.step))
        trackers = self._open_trackers(run_dir, start) if lead else []
        stream = data.stream(partition, start=position) if start < steps else iter(())
        step_fn = self._step()
        progress = Progress(steps, start, enabled=self.progress if lead else False,
                            lines=None if lead else False,
                            keys=getattr(self.objective, "key_metrics", ("loss",)))  # fmt: skip
        if lead and start > 0 and run_dir is not None and start < steps:
            progress.message(f"dew: resuming from step {start} ({run_dir})")
        run = FitRun(self, data, steps, state, position, run_dir, progress, trackers)
        run.last_saved = start if run_dir is not None and position else None
        stop = StopRequest()
        try:
            stop.__enter__()
            for number in range(start + 1, steps + 1):
                local = run.next_batch(stream, number)
                run.update(step_fn, number, local)
                stopped_by = stop.agreed(number)  # the same answer on every process
                run.report(number, log_every, eval_every, stopping=stopped_by is not None)
                if stopped_by is not None and number < steps:
                    raise TrainingInterrupted(number, stopped_by[0], run_dir, stopped_by[1])
            if run.pending is not None:
                run.check(run.pending)
        finally:
            stop.__exit__()
            progress.close()
            for tracker in trackers:
                tracker.close()
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return run.state

    def _starting_state(
        self,
        state: TrainState | None,
        run_dir: str | os.PathLike[str] | None,
        resume_from: str | os.PathLike[str] | None,
    ) -> tuple[TrainState, int]:
        """The state ``fit`` starts from and its data position, restored from a checkpoint."""
        position = 0
        if state is None:
            state = self.initial_state()
        else:
            self._ensure_shardings(state.params)
        assert state is not None
        if run_dir is not None or resume_from is not None:
            run_dir = None if run_dir is None else os.fspath(run_dir)
            names = frozen.frozen_names(self.objective)
            saved = frozen.without_frozen(state, names)  # what a checkpoint holds
            n_leaves = len(jax.tree_util.tree_leaves(saved))
            restored: ckpt.Restored | None
            if resume_from is not None:
                restored = ckpt.load(resume_from, expected_leaves=n_leaves)
            else:
                restored = ckpt.latest(run_dir or "", expected_leaves=n_leaves)
            if restored is not None:
                expected = frozen.identity(self.objective, state)
                frozen.check_identity(restored.path, restored.meta, expected)
                shardings = frozen.without_frozen(self._shardings, names)
                state = frozen.with_frozen(
                    ckpt.restore_into(saved, shardings, restored), state, names
                )
                position = restored.position
                saved = restored.meta.get("extra", {}).get("rollout")
                load = getattr(self.rollout, "load_state_dict", None)
                if saved is not None and callable(load):
                    load(saved)
        return state, position

    def _open_trackers(self, run_dir: str | None, start: int) -> list[Tracker]:
        """The lead process's trackers: ``metrics.jsonl`` (and TensorBoard) first, then the rest."""
        trackers: list[Tracker] = []
        specs = [s for s in self.trackers if s not in ("jsonl", "tensorboard")]
        if run_dir is not None:
            specs = ["jsonl", *(["tensorboard"] if self.tensorboard else []), *specs]
        for spec in specs:
            if isinstance(spec, str) and run_dir is None:
                raise ValueError(f"trackers: {spec!r} needs fit(run_dir=...)")
            trackers.append(make_tracker(spec, run_dir or "", start))
        return trackers

    def _learning_rate(self, state: TrainState, number: int) -> float | None:
        lr = _find_learning_rate(state.opt_state)
        if lr is None and self.learning_rate is not None:
            lr = (
                self.learning_rate(number - 1)
                if callable(self.learning_rate)
                else self.learning_rate
            )
        return None if lr is None else float(jax.device_get(lr))


__all__ = ["NonFiniteLossError", "TrainState", "Trainer", "TrainingInterrupted"]

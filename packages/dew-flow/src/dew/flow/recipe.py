"""``dew train flow``: Flow-GRPO from a config, found by ``dew`` through an entry point.

``dew`` does not import ``dew.flow``; it loads ``train`` below by the entry point ``flow`` of
the group ``dew.recipes`` (see ``pyproject.toml``) and hands it the config mapping (file,
flags and ``--set`` merged). ``train`` checks the whole config (``dew.flow.recipe_config``),
builds the ``SimpleDiT``, its ``FlowGRPOObjective`` and ``FlowRollout``, and trains with the
dew ``Trainer`` in ``run.run_dir``: checkpoints every ``run.checkpoint_every`` steps and at
the end, ``metrics.jsonl``, and ``config.json``. A run directory that holds checkpoints
resumes from the newest one, so a stopped run continued to the same step count ends with the
parameters an uninterrupted run reaches: the policy starts from the seed's initialisation,
the labels of step ``i`` come from ``(seed, i)`` and the rollout's keys from the train state.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from dew.files import write_json
from dew.flow import shapes
from dew.flow.recipe_config import PRESETS, FlowConfig, flow_config, flow_reward
from dew.recipes.schema import ConfigError

__all__ = ["build", "train"]

_SAME = ("kind", "model", "data")


def _batches(config: FlowConfig) -> Any:
    labels = np.asarray(config.data.labels, np.int32)
    seed, batch = config.run.seed, config.run.batch

    def rows(partition: Any, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        count = batch // partition.count
        for i in itertools.count(start):
            rng = np.random.default_rng([seed, i, partition.index])
            yield {"label": rng.choice(labels, count).astype(np.int32)}

    return rows


def build(config: FlowConfig) -> tuple[Any, Any]:
    """The ``FlowGRPOObjective`` and ``FlowRollout`` of ``config`` (a value the classes refuse
    is a ``ConfigError`` naming its ``objective`` key)."""
    from dew.flow.grpo import FlowGRPOObjective
    from dew.flow.inputs import Field, InputSpec
    from dew.flow.models import LabelEncoder, SimpleDiT
    from dew.flow.rollout import FlowRollout

    m, o = config.model, config.objective
    inputs = InputSpec(Field("image", (shapes.SIZE, shapes.SIZE, 3)), Field("label", (), "int32"))
    model = SimpleDiT(output_channels=3, patch_size=m.patch_size, emb_features=m.emb_features,
                      num_layers=m.num_layers, num_heads=m.num_heads, mlp_ratio=m.mlp_ratio)  # fmt: skip
    encoders = {"label": LabelEncoder(shapes.LABELS, m.emb_features)}
    try:
        process = PRESETS[m.preset](shift=m.shift, noise_level=o.noise_level)()
        objective = FlowGRPOObjective(model, process, inputs, guidance=o.guidance, beta=o.beta,
                                      steps=o.steps, encoders=encoders,
                                      epsilon_low=o.epsilon_low, epsilon_high=o.epsilon_high,
                                      advantage_clip=o.advantage_clip)  # fmt: skip
        rollout = FlowRollout(objective, flow_reward(o), groups=o.groups, steps=o.steps,
                              train_steps=o.train_steps)  # fmt: skip
    except (TypeError, ValueError) as err:
        raise ConfigError(f"objective.{err}") from None
    return objective, rollout


def _check_run_dir(config: FlowConfig) -> None:
    """Refuse a run directory whose checkpoints come from another kind, model or data."""
    from dew.recipes.train import check_same_run

    check_same_run(config.run.run_dir, config.as_dict(), _SAME)


def train(mapping: Mapping[str, Any]) -> Any:
    """Check ``mapping``, train it (resuming from ``run.run_dir``'s newest checkpoint) and
    return the final ``TrainState``. The entry point ``flow`` of ``dew.recipes``."""
    import jax

    from dew.data import Dataset
    from dew.recipes.builder import build_optimizer
    from dew.trainer import Trainer

    config = flow_config(mapping)
    objective, rollout = build(config)
    _check_run_dir(config)
    r = config.run
    optimizer = build_optimizer(config.optimizer, config.schedule, steps=r.steps)
    trainer = Trainer(objective, optimizer, key=jax.random.key(r.seed), rollout=rollout,
                      checkpoint_every=r.checkpoint_every, keep_checkpoints=r.keep,
                      progress=r.progress)  # fmt: skip
    os.makedirs(r.run_dir, exist_ok=True)
    write_json(os.path.join(r.run_dir, "config.json"), config.as_dict(), indent=1,
               sort_keys=True, newline=True)  # fmt: skip
    data = Dataset(train=_batches(config), val=None, records=None, batch=r.batch)
    return trainer.fit(data, steps=r.steps, log_every=r.log_every, run_dir=r.run_dir)

"""SFT keeps no moving average of the weights unless asked: ``LMObjective``, ``dew train sft``'s
objective section and a chain's ``sft`` stage (``build_stage``, which both reach) all default
``ema_decay`` to ``None``. docs/guides/sft.md says why (the memory a copy costs, and nothing
reads it)."""

from __future__ import annotations

import inspect

from dew.objectives.lm import LMObjective
from dew.recipes.stages import build_stage
from dew.recipes.train_config import LMObjectiveConfig
from dew.testing import tiny_decoder


def test_sft_keeps_no_moving_average_by_default():
    assert inspect.signature(LMObjective).parameters["ema_decay"].default is None
    assert LMObjectiveConfig().ema_decay is None
    model = tiny_decoder(16, 8)
    for kind in ("sft", "lm"):
        objective, rollout = build_stage(kind, model, 8, {})
        assert isinstance(objective, LMObjective) and rollout is None, kind
        assert objective.ema_decay is None, kind
    assert build_stage("sft", model, 8, {"ema_decay": 0.99})[0].ema_decay == 0.99

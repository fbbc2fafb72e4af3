"""The shared argument checks of dew.objectives.base, as every objective applies them."""

from __future__ import annotations

import pytest

from dew.objectives.base import validate_ema_decay, validate_pretrained
from dew.objectives.lm import LMObjective
from dew.objectives.rl import DPOObjective, GRPOObjective
from dew.testing import tiny_decoder


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(16, 8, emb_features=8, mlp_features=16)


def test_validate_pretrained_passes_none_and_variables() -> None:
    variables = {"params": {"w": 1}}
    assert validate_pretrained(None) is None
    assert validate_pretrained(variables) is variables


@pytest.mark.parametrize("bad", [{"w": 1}, [1, 2], "params"])
def test_every_objective_names_a_bad_pretrained(model, bad) -> None:
    makers = [
        lambda: LMObjective(model, 4, pretrained=bad),
        lambda: DPOObjective(model, 4, beta=0.1, pretrained=bad),
        lambda: GRPOObjective(model, 4, beta=0.1, pretrained=bad),
    ]
    for make in makers:
        with pytest.raises(ValueError, match=r"pretrained: expected a full variables mapping"):
            make()


def test_validate_ema_decay_range() -> None:
    assert validate_ema_decay(None) is None
    assert validate_ema_decay(1) == 1.0
    with pytest.raises(ValueError, match="ema_decay"):
        validate_ema_decay(1.5)
    with pytest.raises(TypeError, match="ema_decay"):
        validate_ema_decay("fast")

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


def test_lm_objective_keeps_no_ema_tree_by_default(model, tmp_path) -> None:
    import json

    import jax
    import optax

    from dew.trainer import Trainer
    from dew.trainer.checkpoint import save

    def saved_leaves(objective, name):
        trainer = Trainer(objective, optax.sgd(0.1), key=jax.random.key(0), progress=False)
        state = trainer.initial_state()
        path = save(tmp_path / name, state, step=0, position=0)
        with open(f"{path}/meta.json", encoding="utf-8") as f:
            return state, json.load(f)["leaves"]

    objective = LMObjective(model, 4)
    assert objective.ema_decay is None
    state, plain = saved_leaves(objective, "plain")
    assert state.ema is None
    asked, with_ema = saved_leaves(LMObjective(model, 4, ema_decay=0.999), "asked")
    assert jax.tree.structure(asked.ema) == jax.tree.structure(asked.params)
    # the default checkpoint holds one copy of the weights, the asked-for one two
    assert with_ema == plain + len(jax.tree.leaves(asked.params))


def test_the_protocol_declares_what_the_trainer_reads(model) -> None:
    from dew.objectives.base import TOKEN_FIELDS, starts_from_variables, token_fields_of

    variables = {"params": {"w": 1}}
    assert starts_from_variables(LMObjective(model, 4, pretrained=variables))
    assert not starts_from_variables(LMObjective(model, 4))
    assert not starts_from_variables(object())  # the attribute is optional
    assert token_fields_of(LMObjective(model, 4)) == ("text",)
    assert token_fields_of(DPOObjective(model, 4)) == ("input_ids",)
    assert token_fields_of(GRPOObjective(model, 4)) == ("input_ids",)
    assert token_fields_of(object()) == TOKEN_FIELDS


def test_every_token_objective_reads_rows_of_seq_len_plus_one(model) -> None:
    for objective in (LMObjective(model, 5), DPOObjective(model, 5), GRPOObjective(model, 5)):
        assert objective.seq_len == 5 and objective.width == 6, type(objective).__name__

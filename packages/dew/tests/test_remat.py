"""Gradient checkpointing of the decoder layers (``DecoderConfig.remat``, ``dew.models.remat``).

Every policy keeps the parameter tree, gives the loss and gradients of the plain decoder
within float32 rounding, and saves less for the backward pass: the residuals JAX keeps
between a step's forward and backward pass (the leaves of ``jax.vjp``'s backward function,
sized without running anything) shrink by more than four times under ``full``. That is the
memory remat trades away; XLA's CPU scheduler does not turn it into a smaller compiled
``temp_size`` (it computes recomputations early), so ``tools/bench/bench_remat.py`` reports
that figure on each machine instead of a test asserting it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import models
from dew.models.remat import REMAT_POLICIES, check_remat

SMALL = dict(vocab_size=64, emb_features=32, num_layers=2, num_heads=4, num_kv_heads=2,
             mlp_features=64, max_seq_len=32, qk_norm=True)  # fmt: skip
ROWS = jax.random.randint(jax.random.key(0), (2, 33), 0, 64)


def _loss(model: models.CausalTransformer):
    def loss(params: dict, rows: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, rows[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, rows[:, 1:, None], axis=-1).mean()

    return loss


@pytest.fixture(scope="module")
def plain() -> tuple[dict, jax.Array, dict]:
    """Parameters of the plain decoder and its loss and gradients on ROWS."""
    model = models.build("causal_transformer", **SMALL)
    params = jax.jit(model.init)(jax.random.key(1), ROWS[:, :-1])["params"]
    loss, grads = jax.jit(jax.value_and_grad(_loss(model)))(params, ROWS)
    return params, loss, grads


@pytest.mark.parametrize("policy", ["full", "dots_saveable"])
def test_same_parameters_loss_and_gradients(plain: tuple, policy: str) -> None:
    params, loss, grads = plain
    model = models.build("causal_transformer", remat=policy, **SMALL)
    fresh = jax.eval_shape(model.init, jax.random.key(1), ROWS[:, :-1])["params"]
    assert jax.tree.structure(fresh) == jax.tree.structure(params)
    assert [a.shape for a in jax.tree.leaves(fresh)] == [a.shape for a in jax.tree.leaves(params)]
    got_loss, got_grads = jax.jit(jax.value_and_grad(_loss(model)))(params, ROWS)
    np.testing.assert_allclose(got_loss, loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(grads)):
        scale = float(jnp.abs(b).max())
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


def _residual_bytes(policy: str) -> int:
    shape = dict(vocab_size=64, emb_features=64, num_layers=4, num_heads=4, mlp_features=256,
                 max_seq_len=128)  # fmt: skip
    model = models.build("causal_transformer", remat=policy, **shape)
    rows = jax.ShapeDtypeStruct((4, 129), jnp.int32)
    params = jax.eval_shape(lambda r: model.init(jax.random.key(1), r[:, :-1])["params"], rows)
    loss = _loss(model)

    def residuals(params: dict, rows: jax.Array) -> list:
        _, backward = jax.vjp(lambda p: loss(p, rows), params)
        return jax.tree.leaves(backward)

    return sum(a.size * a.dtype.itemsize for a in jax.eval_shape(residuals, params, rows))


def test_remat_saves_less_for_the_backward_pass() -> None:
    saved = {policy: _residual_bytes(policy) for policy in REMAT_POLICIES}
    assert saved["full"] * 4 < saved["none"]
    assert saved["full"] < saved["dots_with_no_batch_dims_saveable"] < saved["dots_saveable"]
    assert saved["dots_saveable"] < saved["none"]


def test_prefill_is_unchanged(plain: tuple) -> None:
    params = plain[0]
    plain_model = models.build("causal_transformer", **SMALL)
    remat_model = models.build("causal_transformer", remat="full", **SMALL)
    lengths = jnp.array([5, 3])
    outs = []
    for model in (plain_model, remat_model):

        def prefill(params: dict, ids: jax.Array, model=model) -> tuple:
            return model.apply({"params": params}, ids, lengths, 12, method="prefill")

        logits, cache = jax.jit(prefill)(params, ROWS[:, :8])
        outs.append((logits, cache.keys[-1]))
    for a, b in zip(outs[0], outs[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bad_policy_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^remat: expected one of none, full, .*got 'some'$"):
        check_remat("some")
    with pytest.raises(ValueError, match=r"^remat: expected one of .*got 'some'$"):
        models.build("causal_transformer", remat="some", **SMALL)


def test_the_flag_and_config_key_reach_the_model(tmp_path) -> None:
    from dew.cli import build_parser, train_mapping
    from dew.recipes.builder import build_model
    from dew.recipes.schema import ConfigError
    from dew.recipes.train_config import train_config

    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.uint16))
    base = ["train", "lm", "--tokens", str(tmp_path / "t.npy"), "--run-dir", str(tmp_path / "r"),
            "--steps", "1"]  # fmt: skip
    config = train_config(train_mapping(build_parser().parse_args(base)), "lm")
    assert config.model.remat == "none"
    args = build_parser().parse_args(base + ["--remat", "dots_saveable"])
    config = train_config(train_mapping(args), "lm")
    model, _ = build_model(config.model, vocab_size=16, max_seq_len=8)
    assert model.config.remat == "dots_saveable"
    args = build_parser().parse_args(base + ["--remat", "half"])
    with pytest.raises(ConfigError, match=r"^model.remat: expected one of none, full, .*'half'$"):
        train_config(train_mapping(args), "lm")


def test_a_saved_checkpoint_is_the_same_with_remat(plain: tuple, tmp_path) -> None:
    params = plain[0]
    for policy, folder in (("none", "plain"), ("full", "remat")):
        model = models.build("causal_transformer", remat=policy, **SMALL)
        models.Pretrained.from_model(model, {"params": params}).save(
            tmp_path / folder, dtype="float32"
        )
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "remat" / name).read_bytes()
    assert "remat" not in (tmp_path / "remat" / "config.json").read_text()
    assert models.load_pretrained(tmp_path / "remat").config.remat == "none"

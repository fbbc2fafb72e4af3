"""dew.models.linear: the same parameters, values and gradients as flax's Dense."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.linear import Linear, matmul


@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_dense_in_tree_values_and_gradients(bias: bool) -> None:
    x = jax.random.normal(jax.random.key(0), (3, 5, 8))
    ours, theirs = Linear(6, use_bias=bias), nn.Dense(6, use_bias=bias)
    variables = theirs.init(jax.random.key(1), x)
    if bias:  # a nonzero bias, so its gradient path is exercised
        variables = {"params": {**variables["params"], "bias": jnp.arange(6.0)}}
    assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(variables)

    def loss(module: nn.Module):
        return lambda v, x: jnp.sum(jnp.sin(module.apply(v, x)))

    np.testing.assert_array_equal(ours.apply(variables, x), theirs.apply(variables, x))
    got = jax.grad(loss(ours), argnums=(0, 1))(variables, x)
    want = jax.grad(loss(theirs), argnums=(0, 1))(variables, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def test_matmul_gradients_in_bfloat16_keep_their_dtypes() -> None:
    x = jax.random.normal(jax.random.key(2), (4, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.key(3), (8, 3)).astype(jnp.bfloat16)
    dx, dw = jax.grad(lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32)), (0, 1))(x, w)
    assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(dw, np.float32),
                               np.asarray(x.T.astype(jnp.float32) @ jnp.ones((4, 3))),
                               rtol=1e-2)  # fmt: skip

"""A dense layer whose backward pass asks XLA's CPU backend for a canonical matmul.

`Linear` holds the same parameters as `flax.linen.Dense` (`kernel` `[D, F]`, optional
`bias` `[F]`), so checkpoints and Hugging Face name maps do not change; only the
gradient of the matmul is written by hand (`matmul`, a `jax.custom_vjp`).

Why: for `y = x @ W` with `x` `[..., D]`, JAX's own transpose rule asks for the weight
gradient as one `dot_general` contracting the leading (batch and time) axes of both
`x` and `dy`. XLA's CPU backend turns that into a copy that transposes the larger
operand plus a dot outside its fast matmul path; on the SFT benchmark's shape this took
about twice as long as writing the same product as `x^T @ dy` over the flattened rows.
The values are the same products summed in the same order (bit-identical in float32
on the shapes tested); `dx = dy @ W^T` is unchanged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@jax.custom_vjp
def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """`x` `[..., D]` @ `kernel` `[D, F]` -> `[..., F]` (same dtype rules as `jnp.dot`)."""
    return jnp.dot(x, kernel)


def _matmul_fwd(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return jnp.dot(x, kernel), (x, kernel)


def _matmul_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, kernel = res
    dx = jnp.dot(g, kernel.T).astype(x.dtype)
    rows_x = x.reshape(-1, x.shape[-1])  # [N, D]
    rows_g = g.reshape(-1, g.shape[-1])  # [N, F]
    dkernel = jnp.dot(rows_x.T, rows_g).astype(kernel.dtype)  # [D, F]
    return dx, dkernel


matmul.defvjp(_matmul_fwd, _matmul_bwd)


class Linear(nn.Module):
    """`flax.linen.Dense` over the last axis with the hand-written matmul gradient.

    Params: `kernel` `[D, F]` and, with `use_bias`, `bias` `[F]`, in `param_dtype`;
    inputs and parameters are cast to `dtype` (the compute dtype) before the matmul,
    as `nn.Dense` does. Input `[..., D]` -> output `[..., F]`.
    """

    features: int
    use_bias: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features),
                            self.param_dtype)  # fmt: skip
        y = matmul(x.astype(self.dtype), kernel.astype(self.dtype))
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y

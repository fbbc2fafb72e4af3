"""ValueHead: a scalar critic on top of a decoder's hidden states.

``ValueHead(backbone)`` maps packed ids ``[B, T]`` (with their ``segment_ids`` and
``positions``, as the decoder reads them) to one float32 value per position ``[B, T]``: the
backbone's final hidden states ``[B, T, D]`` (``backbone.hidden_states``, the method
``dew.models`` decoders expose for this) go through one Dense layer with a single output.

The backbone is any flax module with a ``hidden_states(input_ids, segment_ids=None,
positions=None) -> [B, T, D]`` method. Its parameters live under ``backbone`` and the head's
under ``value`` (``kernel [D, 1]``, ``bias [1]``), in float32. The head starts with a small
kernel (normal, standard deviation 0.01) and a zero bias, so a fresh critic predicts values
near zero whatever the backbone's scale.

Reading the value of the state *before* a token (verl's critic convention) is the objective's
job: it feeds ``input_ids[:, :-1]`` and aligns output column ``t - 1`` with token ``t``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

#: Standard deviation of the head's initial kernel.
HEAD_INIT_STD = 0.01


class ValueHead(nn.Module):
    """One scalar per position from a backbone's hidden states.

    Attributes:
      backbone: a flax module with ``hidden_states(input_ids, segment_ids, positions)``
        returning ``[B, T, D]`` (for example a ``dew.models`` decoder).
    """

    backbone: Any

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """``[B, T]`` int ids (0-padded segments allowed) -> ``[B, T]`` float32 values."""
        method = getattr(self.backbone, "hidden_states", None)
        if method is None:
            raise TypeError(
                f"ValueHead.backbone: expected a module with a hidden_states(input_ids, "
                f"segment_ids, positions) method, got {type(self.backbone).__name__}"
            )
        hidden = method(input_ids, segment_ids=segment_ids, positions=positions)
        if hidden.ndim != 3 or hidden.shape[:2] != input_ids.shape:
            raise ValueError(
                f"ValueHead.backbone.hidden_states: expected [B, T, D] with [B, T] = "
                f"{tuple(input_ids.shape)}, got {tuple(hidden.shape)}"
            )
        value = nn.Dense(
            1,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            kernel_init=nn.initializers.normal(HEAD_INIT_STD),
            bias_init=nn.initializers.zeros,
            name="value",
        )(hidden.astype(jnp.float32))
        return value[..., 0]


__all__ = ["HEAD_INIT_STD", "ValueHead"]

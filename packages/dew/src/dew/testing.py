"""Helpers for tests of code built on dew: one tiny decoder instead of one per test file.

``tiny_decoder(vocab_size, max_seq_len)`` builds a one-layer ``causal_transformer`` (16
features, 2 heads, a 32-wide MLP) that compiles in seconds on a CPU. Keywords override any
``DecoderConfig`` field (``init_std``, ``emb_features``, ...). Nothing here is used by dew
itself; it ships so that tests of dew and of the distributions built on it share one model.
"""

from __future__ import annotations

from typing import Any

from dew.models import CausalTransformer, build

TINY = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}


def tiny_decoder(vocab_size: int, max_seq_len: int, **overrides: Any) -> CausalTransformer:
    """A one-layer ``causal_transformer`` over ``vocab_size`` ids and ``max_seq_len`` positions.

    Args:
      vocab_size: ids ``0 .. vocab_size - 1``.
      max_seq_len: the longest row it reads.
      overrides: any ``DecoderConfig`` field, replacing the ``TINY`` defaults.
    """
    return build(
        "causal_transformer",
        **{**TINY, "vocab_size": vocab_size, "max_seq_len": max_seq_len, **overrides},
    )


__all__ = ["TINY", "tiny_decoder"]

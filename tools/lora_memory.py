"""Bytes of a DPO run's TrainState: full training against a LoRA adapter.

Full training keeps the parameters, their AdamW moments and a frozen copy of the starting
weights in ``TrainState.ema`` (DPO's reference). ``LoraObjective`` keeps the base once (the
``base`` collection), the adapter and its AdamW moments, and no reference copy: the reference
is the base with the adapter off. Shapes only (``jax.eval_shape``), so a 0.6B model costs
nothing to measure::

    .venv/bin/python tools/lora_memory.py
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from dew.models import build
from dew.models.lora import PROJECTIONS, LoraConfig
from dew.objectives.lora import LoraObjective
from dew.objectives.rl import DPOObjective
from dew.trainer.step import make_init

QWEN3_06B = {"vocab_size": 151936, "emb_features": 1024, "num_layers": 28, "num_heads": 16,
             "num_kv_heads": 8, "head_dim": 128, "mlp_features": 3072, "qk_norm": True}  # fmt: skip
TINY = {"vocab_size": 32, "emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}


def nbytes(tree: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(name: str, model: Any, lora: LoraConfig) -> None:
    rng = jax.random.key(0)
    optimizer = optax.adamw(1e-5)
    full = DPOObjective(model, seq_len=127, beta=0.1)
    for label, objective in (("full", full), ("lora", LoraObjective(full, lora))):
        variables = jax.eval_shape(objective.init, rng)
        state = jax.eval_shape(make_init(objective, optimizer), variables, rng)
        parts = {"variables": state.params, "opt_state": state.opt_state, "ema": state.ema}
        sizes = {k: nbytes(v) for k, v in parts.items()}
        shown = "  ".join(f"{k} {v:,} B" for k, v in sizes.items())
        print(f"{name} {label}: total {sum(sizes.values()):,} B  ({shown})")


def main() -> None:
    measure("tiny", build("causal_transformer", max_seq_len=128, **TINY), LoraConfig(2, 4))
    measure("qwen3-0.6B", build("qwen3", max_seq_len=128, **QWEN3_06B),
            LoraConfig(16, 32, targets=PROJECTIONS))  # fmt: skip


if __name__ == "__main__":
    main()

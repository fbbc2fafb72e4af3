"""What a LoRA adapter is: its rank, its scale, its dropout and the projections it targets.

`LoraConfig` follows PEFT's `LoraConfig` (peft 0.21) for the fields Dew supports:
`rank` is PEFT's `r`, `alpha` its `lora_alpha`, `dropout` its `lora_dropout`,
`rslora` its `use_rslora` and `targets` its `target_modules`. The scale that
multiplies the adapter's output is `alpha / rank`, or `alpha / sqrt(rank)` with
rsLoRA (Kalajdzievski 2023, "A Rank Stabilization Scaling Factor for
Fine-Tuning with LoRA").

`targets` is either a sequence of projection names, where an entry selects every
projection whose Hugging Face module name (`model.layers.3.self_attn.q_proj`)
equals it or ends with `.` + it (so `"q_proj"` selects the query projection of
every layer and `"layers.0.mlp.up_proj"` one layer's), or a single string, a
regular expression that must match a whole module name. These are PEFT's two
rules, so an `adapter_config.json` selects the same projections in both.
"""

from __future__ import annotations

import dataclasses
import math

from dew.checks import finite_float, is_int

#: The projections of Dew's decoder an adapter may wrap (its `Linear` layers but the head).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank, scale, dropout and targets of a LoRA adapter (hashable, jit-static).

    rank: the inner width r (>= 1; each target checks it against its own
    widths). alpha: the numerator of the scale (> 0). targets: projection
    names or one regular expression (see the module docstring); the default
    wraps the four attention projections. dropout: the probability, in
    [0, 1), of zeroing an input of the adapter path when a dropout key is
    given; the base path never sees dropout. rslora: scale by
    `alpha / sqrt(rank)` instead of `alpha / rank`.
    """

    rank: int
    alpha: float
    targets: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj")
    dropout: float = 0.0
    rslora: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.rank) or self.rank < 1:
            raise ValueError(f"rank: expected an int >= 1, got {self.rank!r}")
        alpha = finite_float(self.alpha, "alpha")
        if alpha <= 0:
            raise ValueError(f"alpha: expected a number > 0, got {self.alpha!r}")
        dropout = finite_float(self.dropout, "dropout")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {self.dropout!r}")
        if not isinstance(self.rslora, bool):
            raise ValueError(f"rslora: expected a bool, got {self.rslora!r}")
        targets = self.targets
        if not isinstance(targets, str):
            targets = tuple(targets)
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise ValueError(
                    f"targets: expected non-empty projection names or one pattern, got {targets!r}"
                )
        elif not targets:
            raise ValueError("targets: expected a non-empty pattern, got ''")
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "dropout", dropout)

    @property
    def scale(self) -> float:
        """What the adapter's output is multiplied by: alpha / r, or alpha / sqrt(r)."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

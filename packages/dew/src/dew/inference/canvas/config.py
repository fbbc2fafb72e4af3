"""`Canvas`: how a masked-diffusion model fills a fixed-length canvas, and the marker that
keeps canvas generation out of the RL rollouts.

A canvas is a row of `P + G` ids: the prompt's `P` ids stay fixed and the `G` generated
positions start as the mask id. `steps` iterations of the model over the whole canvas
unmask them, one block of `block_length` positions at a time, left to right (one block
when `block_length` is None). Two strategies decide which positions unmask at each step:

- `"ancestral"`: MDLM's ancestral sampler (Sahoo et al. 2024, kuleshov-group/mdlm
  `diffusion.py`, `_ddpm_update`): a masked position stays masked with probability
  `move_chance(s) / move_chance(t)` and otherwise takes a token drawn from the model's
  distribution, with `t` going from 1 to `eps` in equal strides inside each block. Tokens
  still masked after a block's last step take the model's most likely id (MDLM's
  `noise_removal`) when `noise_removal` is on.
- `"low_confidence"`: LLaDA's remasking (Nie et al. 2025, ML-GSAI/LLaDA `generate.py`):
  every step draws a token for each masked position of the current block and keeps the
  `n` with the highest model probability, `n` spreading the block's length evenly over
  its steps (the first `length % steps` steps take one more).

Without `block_causal` both run the whole canvas through the model at every step: a
bidirectional model lets every position see the masked blocks after it, so nothing can be
cached. With `block_causal=True` the model reads the canvas with `block_size=block_length`
(block diffusion, BD3-LM): the current block sees the finished blocks before it and
itself, never the masked blocks after it, so every prompt length must then be a multiple
of `block_length` (the model's blocks start at position 0, and the prompt is itself read
as blocks of `block_length`, each seeing itself and the prompt blocks before it). Then,
by default (`kv_cache=True`), the prompt and every finished block run through the model
once into a key/value cache and each step runs the current block alone against it
(`dew.inference.canvas.cached`): the same logits up to float32 rounding, so the same
tokens for a key, at `L` instead of `P + G` queries per step. `kv_cache=False` keeps the
whole-canvas pass.

`Canvas` and `CanvasGeneration` carry `canvas_generator = True`: `refuse_canvas` turns
such an object, given where an autoregressive policy is expected, into
`NotAutoregressive`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

import jax

from dew.checks import is_int

REMASKING = ("ancestral", "low_confidence")


class MoveChance(Protocol):
    """A noise schedule: `move_chance(t)`, the probability a token is masked at time `t`
    (`dew.objectives.diffusion`'s schedules have it)."""

    def move_chance(self, t: jax.Array) -> jax.Array: ...


class NotAutoregressive(TypeError):
    """A canvas generator given where per-token autoregressive likelihoods are needed."""


def refuse_canvas(field: str, value: Any, user: str) -> None:
    """Raise `NotAutoregressive` when `value` is marked `canvas_generator`.

    field: the argument's name; user: what refuses it (`"SampledRollout"`, ...).
    """
    if getattr(value, "canvas_generator", False) is True:
        raise NotAutoregressive(
            f"{field}: {user} needs an autoregressive policy with per-token likelihoods; "
            f"a {type(value).__name__} fills a masked canvas and gives no per-token "
            "autoregressive likelihoods"
        )


def _positive(name: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Canvas:
    """How to fill a canvas (see the module docstring).

    mask_id: the absorbing id; `real_tokens <= mask_id` (prompts never hold it).
    real_tokens: how many ids (`0 .. real_tokens - 1`) the data holds.
    steps: model calls over the whole canvas (not counting `noise_removal`'s), a multiple
      of the number of blocks (each block takes `steps // blocks`).
    remasking: `"ancestral"` or `"low_confidence"`.
    block_length: positions per block (None: the whole generated length is one block);
      it must divide the generated length.
    block_causal: run the model block-causally (`block_size=block_length`), for block
      diffusion models; needs `block_length`.
    schedule: ancestral only: an object with `move_chance(t)` (None: MDLM's log-linear
      schedule, `(1 - 1e-3) t`). eps: ancestral only: the last time of a block (MDLM's
      sampling default 1e-5). noise_removal: ancestral only: fill what a block's steps
      left masked with the most likely id.
    kv_cache: with `block_causal`, cache the prompt's and finished blocks' keys and values
      and run each step over the current block only (True, the default); False runs the
      whole canvas every step. Without `block_causal` it changes nothing.
    """

    canvas_generator: ClassVar[bool] = True

    mask_id: int
    real_tokens: int
    steps: int
    remasking: str = "low_confidence"
    block_length: int | None = None
    block_causal: bool = False
    schedule: Any = None
    eps: float = 1e-5
    noise_removal: bool = True
    kv_cache: bool = True

    def __post_init__(self) -> None:
        for name in ("mask_id", "real_tokens"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
        if self.mask_id < self.real_tokens:
            raise ValueError(
                f"mask_id: {self.mask_id} is inside the data's real tokens "
                f"0..{self.real_tokens - 1}; expected an id >= {self.real_tokens}"
            )
        _positive("steps", self.steps)
        for name in ("block_causal", "noise_removal", "kv_cache"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking: expected one of {REMASKING}, got {self.remasking!r}")
        if self.block_length is not None:
            _positive("block_length", self.block_length)
        if self.block_causal and self.block_length is None:
            raise ValueError("block_causal: block-causal attention needs a block_length")
        if not isinstance(self.eps, float | int) or not 0.0 <= self.eps < 1.0:
            raise ValueError(f"eps: expected a float in [0, 1), got {self.eps!r}")
        if self.schedule is not None and not callable(getattr(self.schedule, "move_chance", 0)):
            raise TypeError(
                f"schedule: expected None or an object with move_chance(t), got "
                f"{type(self.schedule).__name__}"
            )

    def blocks(self, gen_length: int) -> tuple[int, int]:
        """`(block length, number of blocks)` for `gen_length` generated positions, after
        checking that the block length divides it and the block count divides `steps`."""
        length = self.block_length or gen_length
        if gen_length % length:
            raise ValueError(
                f"block_length: {length} does not divide the generated length {gen_length}"
            )
        count = gen_length // length
        if self.steps % count:
            raise ValueError(
                f"steps: {self.steps} is not divisible by the number of blocks {count} "
                f"({gen_length} generated / block_length {length})"
            )
        return length, count

    def iterations_per_block(self, gen_length: int) -> int:
        """Loop iterations per block: its steps, plus one for `noise_removal` (ancestral)."""
        length, count = self.blocks(gen_length)
        del length
        extra = int(self.remasking == "ancestral" and self.noise_removal)
        return self.steps // count + extra

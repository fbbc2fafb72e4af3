"""What a flow batch holds: ``Field`` (name, per-row shape, dtype) and ``InputSpec``.

An ``InputSpec`` lists the fields of a batch. One of them is the *target*, the image the flow
model learns to generate (``[B, H, W, C]``; ``uint8`` pixels in ``[0, 255]`` or floats already
in ``[-1, 1]``). Every other field is a *condition* read by a conditioning encoder (class
labels ``[B]``, token ids ``[B, L]`` ...).

Generation needs only the conditions: a prompt-only batch (``InputSpec.tokenize(prompts)``)
has no target field, and the target's declared shape tells the sampler what to draw.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np


class InputError(ValueError):
    """A batch does not match its ``InputSpec`` (the message names the field)."""


@dataclass(frozen=True)
class Field:
    """One batch field: ``name``, the ``shape`` of one row and its ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: Any = "uint8"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Field.name: expected a non-empty string, got {self.name!r}")
        try:
            shape = tuple(int(d) for d in self.shape)
        except TypeError as err:
            raise TypeError(
                f"Field({self.name!r}).shape: expected a tuple of ints, got {self.shape!r}"
            ) from err
        if any(d < 1 for d in shape):
            raise ValueError(f"Field({self.name!r}).shape: expected positive sizes, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


def to_unit(images: Any) -> Any:
    """Pixels to ``[-1, 1]`` float32: ``uint8`` ``[0, 255]`` is rescaled, floats pass through."""
    x = jnp.asarray(images)
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 127.5 - 1.0
    return x.astype(jnp.float32)


def byte_tokens(text: str) -> list[int]:
    """Default tokenizer: UTF-8 bytes shifted by one, so that 0 is left for padding."""
    return [b + 1 for b in text.encode("utf-8")]


class InputSpec:
    """The fields of a flow batch.

    Args:
      *fields: the ``Field`` values; names must be unique.
      target: the name of the image field (default ``"image"``); it must be one of ``fields``
        and have a ``[H, W, C]`` shape.
      tokenizer: ``text -> list of ids`` used by :meth:`tokenize` (default: UTF-8 bytes + 1,
        vocabulary 257), or an object with ``encode(text)`` returning ids or an object with
        ``.ids`` (a ``tokenizers.Tokenizer``).
    """

    def __init__(self, *fields: Field, target: str = "image", tokenizer: Any = None) -> None:
        if not fields:
            raise ValueError("InputSpec: expected at least one Field, got none")
        names = [f.name for f in fields]
        for f in fields:
            if not isinstance(f, Field):
                raise TypeError(f"InputSpec: expected Field values, got {type(f).__name__}")
        if len(set(names)) != len(names):
            raise ValueError(f"InputSpec: field names must be unique, got {names}")
        if target not in names:
            raise ValueError(f"InputSpec.target: {target!r} is not one of the fields {names}")
        self.fields = tuple(fields)
        self.target = target
        self.tokenizer = tokenizer
        if len(self.target_field.shape) != 3:
            raise ValueError(
                f"Field({target!r}).shape: expected [H, W, C] for the target image, got "
                f"{self.target_field.shape}"
            )

    @property
    def target_field(self) -> Field:
        """The image field."""
        return next(f for f in self.fields if f.name == self.target)

    @property
    def conditions(self) -> tuple[Field, ...]:
        """Every field except the target, in declaration order."""
        return tuple(f for f in self.fields if f.name != self.target)

    def rows(self, batch: Mapping[str, Any]) -> int:
        """The row count of ``batch`` (its target or else its first condition)."""
        for f in (self.target_field, *self.conditions):
            if f.name in batch:
                return int(np.shape(batch[f.name])[0])
        raise InputError(
            f"batch: expected at least one of the fields {[f.name for f in self.fields]}, got "
            f"{sorted(batch)}"
        )

    def check(self, batch: Mapping[str, Any], *, target: bool) -> None:
        """Raise ``InputError`` naming the first field whose shape does not match.

        ``target=True`` requires the image field; conditions are always required.
        """
        wanted = [*self.conditions, *([self.target_field] if target else [])]
        rows = None
        for f in wanted:
            if f.name not in batch:
                why = "the image to learn from" if f.name == self.target else "a condition"
                raise InputError(f"batch[{f.name!r}]: missing ({why}); got fields {sorted(batch)}")
            shape = tuple(np.shape(batch[f.name]))
            if shape[1:] != f.shape:
                raise InputError(
                    f"batch[{f.name!r}]: expected shape [B, {', '.join(map(str, f.shape))}]"
                    f"{'' if f.shape else ' (one value per row)'}, got {list(shape)}"
                )
            if rows is not None and shape[0] != rows:
                raise InputError(
                    f"batch[{f.name!r}]: expected {rows} rows like the other fields, got {shape[0]}"
                )
            rows = shape[0]

    def condition_fields(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The condition columns of ``batch`` (a new dict; arrays are not copied)."""
        return {f.name: batch[f.name] for f in self.conditions}

    def _encode(self, text: str) -> list[int]:
        tok = self.tokenizer
        if tok is None:
            return byte_tokens(text)
        if hasattr(tok, "encode"):
            out = tok.encode(text)
            return list(getattr(out, "ids", out))
        if callable(tok):
            return list(tok(text))
        raise TypeError(f"InputSpec.tokenizer: expected a callable or .encode(), got {tok!r}")

    def tokenize(self, prompts: Sequence[str], field: str | None = None) -> dict[str, np.ndarray]:
        """Token ids of ``prompts`` for the condition ``field``: ``{field: [B, L] ids}``.

        ``field`` defaults to the only condition with a one-axis shape ``[L]``. Ids are written
        left-aligned and padded with 0; a prompt longer than ``L`` raises ``InputError`` (it is
        never cut). The result has no image field: it is a batch for generation.
        """
        if isinstance(prompts, str):
            raise TypeError("prompts: expected a sequence of strings, got one string")
        candidates = [f for f in self.conditions if len(f.shape) == 1]
        if field is None:
            if len(candidates) != 1:
                raise InputError(
                    "tokenize: expected exactly one condition field of shape [L], got "
                    f"{[f.name for f in candidates]}; pass field="
                )
            spec = candidates[0]
        else:
            found = [f for f in candidates if f.name == field]
            if not found:
                raise InputError(f"tokenize(field={field!r}): not a condition field of shape [L]")
            spec = found[0]
        width = spec.shape[0]
        out = np.zeros((len(prompts), width), spec.dtype)
        for row, text in enumerate(prompts):
            ids = self._encode(text)
            if len(ids) > width:
                raise InputError(
                    f"prompts[{row}]: {len(ids)} tokens do not fit Field({spec.name!r}) of "
                    f"length {width}: {text!r}"
                )
            out[row, : len(ids)] = ids
        return {spec.name: out}

    def __repr__(self) -> str:
        return f"InputSpec({', '.join(map(repr, self.fields))}, target={self.target!r})"


Tokenizer = Callable[[str], list[int]]

__all__ = ["Field", "InputError", "InputSpec", "byte_tokens", "to_unit"]

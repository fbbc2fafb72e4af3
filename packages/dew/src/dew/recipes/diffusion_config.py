"""The ``masked_diffusion`` objective of ``dew train lm``: its keys, checks and defaults.

``objective.name`` picks the loss of an ``lm`` run: ``next_token`` (``LMObjective``, the
default) or ``masked_diffusion`` (``MaskedDiffusionObjective``, MDLM's loss on the same
decoder run bidirectionally). The other keys belong to ``masked_diffusion`` alone:

- ``noise_schedule``: ``loglinear`` (MDLM's default) or ``cosine``.
- ``real_tokens``: ids ``0 .. real_tokens - 1`` are the data's; default: the largest id of
  ``data.tokens`` (and ``data.val_tokens``) plus one.
- ``mask_id``: the absorbing id, ``>= real_tokens`` and below the model's vocabulary;
  default: ``real_tokens``. A fresh model whose ``model.vocab_size`` is unset gets one more
  row to hold it; a set ``model.vocab_size`` or a pretrained model must already have room.

Every bad value is refused in one line naming its key (``objective.<key>`` for ``dew
train``, the stage for ``build_stage``'s other callers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.recipes.schema import ConfigError

OBJECTIVE_NAMES = ("next_token", "masked_diffusion")
NOISE_SCHEDULES = ("loglinear", "cosine")
#: The ``objective`` keys of ``dew train lm`` besides ``ema_decay``.
DIFFUSION_KEYS = ("name", "noise_schedule", "mask_id", "real_tokens")


def check_diffusion(options: Any, label: str = "objective") -> None:
    """Check what can be checked without the data: the names, that the diffusion keys
    come with ``name: masked_diffusion`` only, and ``mask_id >= real_tokens`` when both
    are set. ``options`` has the ``DIFFUSION_KEYS`` as attributes."""
    name = options.name
    if name not in OBJECTIVE_NAMES:
        raise ConfigError(f"{label}.name: expected one of {', '.join(OBJECTIVE_NAMES)}, "
                          f"got {name!r}")  # fmt: skip
    if options.noise_schedule not in NOISE_SCHEDULES:
        raise ConfigError(f"{label}.noise_schedule: expected one of "
                          f"{', '.join(NOISE_SCHEDULES)}, got {options.noise_schedule!r}")  # fmt: skip
    if name != "masked_diffusion":
        given = {"noise_schedule": options.noise_schedule != "loglinear",
                 "mask_id": options.mask_id is not None,
                 "real_tokens": options.real_tokens is not None}  # fmt: skip
        for key, changed in given.items():
            if changed:
                raise ConfigError(f"{label}.{key}: only {label}.name masked_diffusion takes "
                                  f"it, got {label}.name {name}")  # fmt: skip
        return
    for key in ("mask_id", "real_tokens"):
        value = getattr(options, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):  # fmt: skip
            raise ConfigError(f"{label}.{key}: expected an integer >= 0, got {value!r}")
    _check_ids(options.mask_id, options.real_tokens, None, label)


def _check_ids(mask: int | None, real: int | None, vocab: int | None, label: str) -> None:
    if mask is not None and real is not None and mask < real:
        raise ConfigError(
            f"{label}.mask_id: expected an id >= {label}.real_tokens {real} (ids 0..{real - 1} "
            f"are the data's tokens), got {mask}"
        )
    if mask is not None and vocab is not None and mask >= vocab:
        raise ConfigError(
            f"{label}.mask_id: expected an id below the model's vocab_size {vocab} (set "
            f"model.vocab_size above {mask}, or a smaller mask_id), got {mask}"
        )


def fill_diffusion_ids(config: Any, options: dict[str, Any], vocab: int, count: int) -> int:
    """Fill ``options``' unset ``real_tokens`` (``count``: the largest id of the token files
    plus one) and ``mask_id`` (in place) and return the vocabulary a fresh model needs
    (``vocab``, or ``mask_id + 1`` when larger and ``model.vocab_size`` is unset)."""
    real = options.get("real_tokens")
    if real is None:
        real = count
    elif real < count:
        raise ConfigError(f"objective.real_tokens: expected at least {count} (the data holds "
                          f"ids up to {count - 1}), got {real}")  # fmt: skip
    mask = real if options.get("mask_id") is None else options["mask_id"]
    _check_ids(mask, real, None, "objective")
    options.update(real_tokens=real, mask_id=mask)
    if config.model.vocab_size is None and config.model.pretrained is None:
        return max(vocab, mask + 1)
    return vocab


def build_masked_diffusion(
    model: Any, width: int, options: Mapping[str, Any], *, pretrained: Any, where: str
) -> Any:
    """``MaskedDiffusionObjective`` over rows of ``width`` ids; an unset ``mask_id`` is the
    model's last id and an unset ``real_tokens`` every id below the mask."""
    from dew.objectives.masked_diffusion import MaskedDiffusionObjective

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    schedule = options.get("noise_schedule", "loglinear")
    if schedule not in NOISE_SCHEDULES:
        raise ConfigError(f"{where}.noise_schedule: expected one of "
                          f"{', '.join(NOISE_SCHEDULES)}, got {schedule!r}")  # fmt: skip
    mask, real = options.get("mask_id"), options.get("real_tokens")
    if mask is None:
        mask = real if real is not None else (vocab or 1) - 1
    real = mask if real is None else real
    _check_ids(mask, real, vocab, where)
    try:
        return MaskedDiffusionObjective(model, width - 1, mask_id=mask, real_tokens=real,
                                        schedule=schedule, pretrained=pretrained,
                                        ema_decay=options.get("ema_decay"))  # fmt: skip
    except ValueError as err:
        raise ConfigError(f"{where}.{err}") from None


__all__ = ["DIFFUSION_KEYS", "NOISE_SCHEDULES", "OBJECTIVE_NAMES", "build_masked_diffusion",
           "check_diffusion", "fill_diffusion_ids"]  # fmt: skip

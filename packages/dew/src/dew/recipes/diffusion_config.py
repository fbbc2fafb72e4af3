"""The diffusion objectives of ``dew train lm``: their keys, checks and defaults.

``objective.name`` picks the loss of an ``lm`` run: ``next_token`` (``LMObjective``, the
default), ``masked_diffusion`` (``MaskedDiffusionObjective``, MDLM's loss on the same
decoder run bidirectionally) or ``block_diffusion`` (``BlockDiffusionObjective``, BD3-LM's
loss on the decoder's two-copy pass). The other keys belong to the diffusion names:

- ``noise_schedule`` (``masked_diffusion``): ``loglinear`` (MDLM's default) or ``cosine``;
  ``block_diffusion`` runs BD3-LM's log-linear schedule and takes ``loglinear`` only.
- ``block_size`` (``block_diffusion``, required): tokens per block, dividing the row length
  ``data.seq_len``.
- ``mask_rate_min`` / ``mask_rate_max`` (``block_diffusion``): the clip of BD3-LM's noise
  schedule, each block's mask rate drawn in ``[min, max]`` within ``(0, 1]`` (defaults
  ``1e-3`` and ``1``; bd3lms trains with ``[0.3, 0.8]`` for its clipped runs).
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

OBJECTIVE_NAMES = ("next_token", "masked_diffusion", "block_diffusion")
DIFFUSION_NAMES = ("masked_diffusion", "block_diffusion")
NOISE_SCHEDULES = ("loglinear", "cosine")
#: The ``objective`` keys of ``dew train lm`` besides ``ema_decay``.
DIFFUSION_KEYS = ("name", "noise_schedule", "mask_id", "real_tokens", "block_size",
                  "mask_rate_min", "mask_rate_max")  # fmt: skip
#: The clip of block_diffusion's mask rate when unset (``BlockDiffusionObjective``'s).
MASK_RATES = {"mask_rate_min": 1e-3, "mask_rate_max": 1.0}


def check_diffusion(options: Any, label: str = "objective") -> None:
    """Check what can be checked without the data: the names, that the diffusion keys
    come with a diffusion name only (``block_size`` with ``block_diffusion`` only, which
    needs it), and ``mask_id >= real_tokens`` when both are set. ``options`` has the
    ``DIFFUSION_KEYS`` as attributes."""
    name = options.name
    if name not in OBJECTIVE_NAMES:
        raise ConfigError(f"{label}.name: expected one of {', '.join(OBJECTIVE_NAMES)}, "
                          f"got {name!r}")  # fmt: skip
    if options.noise_schedule not in NOISE_SCHEDULES:
        raise ConfigError(f"{label}.noise_schedule: expected one of "
                          f"{', '.join(NOISE_SCHEDULES)}, got {options.noise_schedule!r}")  # fmt: skip
    _check_block_key(name, options.block_size, label)
    _check_mask_rates(name, options, label)
    if name == "block_diffusion" and options.noise_schedule != "loglinear":
        raise ConfigError(f"{label}.noise_schedule: block_diffusion runs BD3-LM's loglinear "
                          f"schedule only, got {options.noise_schedule!r}")  # fmt: skip
    if name not in DIFFUSION_NAMES:
        given = {"noise_schedule": options.noise_schedule != "loglinear",
                 "mask_id": options.mask_id is not None,
                 "real_tokens": options.real_tokens is not None}  # fmt: skip
        for key, changed in given.items():
            if changed:
                raise ConfigError(f"{label}.{key}: only {label}.name masked_diffusion or "
                                  f"block_diffusion takes it, got {label}.name {name}")  # fmt: skip
        return
    for key in ("mask_id", "real_tokens"):
        value = getattr(options, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):  # fmt: skip
            raise ConfigError(f"{label}.{key}: expected an integer >= 0, got {value!r}")
    _check_ids(options.mask_id, options.real_tokens, None, label)


def _check_block_key(name: str, size: Any, label: str) -> None:
    if name != "block_diffusion":
        if size is not None:
            raise ConfigError(f"{label}.block_size: only {label}.name block_diffusion takes "
                              f"it, got {label}.name {name}")  # fmt: skip
        return
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{label}.block_size: expected a positive integer (tokens per "
                          f"block) for block_diffusion, got {size!r}")  # fmt: skip


def _check_mask_rates(name: str, options: Any, label: str) -> None:
    """The clip keys: numbers in (0, 1], min <= max, and set with block_diffusion only."""
    rates = {key: getattr(options, key, default) for key, default in MASK_RATES.items()}
    for key, value in rates.items():
        if name != "block_diffusion" and value != MASK_RATES[key]:
            raise ConfigError(f"{label}.{key}: only {label}.name block_diffusion takes it, "
                              f"got {label}.name {name}")  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ConfigError(f"{label}.{key}: expected a number in (0, 1], got {value!r}")
    if rates["mask_rate_min"] > rates["mask_rate_max"]:
        raise ConfigError(f"{label}.mask_rate_min: expected at most {label}.mask_rate_max "
                          f"{rates['mask_rate_max']}, got {rates['mask_rate_min']}")  # fmt: skip


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
    """``MaskedDiffusionObjective`` (or, with ``name: block_diffusion``,
    ``BlockDiffusionObjective``) over rows of ``width`` ids; an unset ``mask_id`` is the
    model's last id and an unset ``real_tokens`` every id below the mask."""
    from dew.objectives.block_diffusion import BlockDiffusionObjective
    from dew.objectives.masked_diffusion import MaskedDiffusionObjective

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    schedule = options.get("noise_schedule", "loglinear")
    if schedule not in NOISE_SCHEDULES:
        raise ConfigError(f"{where}.noise_schedule: expected one of "
                          f"{', '.join(NOISE_SCHEDULES)}, got {schedule!r}")  # fmt: skip
    block = options.get("name") == "block_diffusion"
    if block:
        _check_block_key("block_diffusion", options.get("block_size"), where)
    mask, real = options.get("mask_id"), options.get("real_tokens")
    if mask is None:
        mask = real if real is not None else (vocab or 1) - 1
    real = mask if real is None else real
    _check_ids(mask, real, vocab, where)
    common = dict(mask_id=mask, real_tokens=real, pretrained=pretrained,
                  ema_decay=options.get("ema_decay"))  # fmt: skip
    try:
        if block:
            rates = {key: options.get(key, default) for key, default in MASK_RATES.items()}
            return BlockDiffusionObjective(model, width - 1, options["block_size"], **rates,
                                           **common)  # fmt: skip
        return MaskedDiffusionObjective(model, width - 1, schedule=schedule, **common)
    except ValueError as err:
        raise ConfigError(f"{where}.{err}") from None


__all__ = ["DIFFUSION_KEYS", "DIFFUSION_NAMES", "MASK_RATES", "NOISE_SCHEDULES", "OBJECTIVE_NAMES", "build_masked_diffusion",
           "check_diffusion", "fill_diffusion_ids"]  # fmt: skip

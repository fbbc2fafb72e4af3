"""``dew generate`` / ``dew eval`` with ``--adapter DIR``: a base model plus a LoRA adapter.

``attach_adapter(loaded, directory, merge=...)`` reads a PEFT-layout adapter directory
(``adapter_config.json`` + ``adapter_model.safetensors``: what ``dew train ... --lora-rank``
writes to ``RUN_DIR/adapter`` and what PEFT's ``save_pretrained`` writes) for the base that
``load_model`` loaded, and returns the ``LoadedModel`` that samples through it:

* unmerged (the default): the adapter is applied on the fly by a ``LoraDecoder``
  (``dew.inference.adapter.with_adapter``), the base weights untouched;
* merged (``--merge-adapter``): ``kernel + scale * a @ b`` folded into each targeted kernel
  once, so decoding costs what the base's does.

Both give the same completions up to rounding (greedy ids agree; log-probs to about 1e-6
in float32). Every refusal is one ``ConfigError`` line naming ``--adapter``: a missing
directory, one without ``adapter_config.json`` or the weights file, a PEFT setting Dew's
LoRA lacks, or an adapter made for another base shape or rank.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dew.recipes.generate import LoadedModel
from dew.recipes.schema import ConfigError

FLAG = "--adapter"


def _check_directory(path: str) -> None:
    from dew.models.lora.peft_io import CONFIG, WEIGHTS

    if not os.path.isdir(path):
        raise FileNotFoundError(f"{FLAG}: no such directory {path!r}")
    for name in (CONFIG, WEIGHTS):
        if not os.path.isfile(os.path.join(path, name)):
            raise ConfigError(
                f"{FLAG}: expected a PEFT adapter directory holding {name} (as dew train "
                f"--lora-rank writes to RUN_DIR/adapter), got {path} without it"
            )


def attach_adapter(loaded: LoadedModel, directory: Any, *, merge: bool = False) -> LoadedModel:
    """``loaded`` sampling through the PEFT adapter in ``directory`` (see the module
    docstring); ``source`` gains ``+ adapter DIR (merged|unmerged)``."""
    from dew.inference.adapter import with_adapter
    from dew.models.lora import load_peft_adapter

    path = os.path.expanduser(os.fspath(directory))
    _check_directory(path)
    try:
        adapters, lora = load_peft_adapter(path, loaded.model.config)
        model, variables = with_adapter(loaded.model, loaded.variables, adapters, lora, merge=merge)
    except (ValueError, TypeError, KeyError, OSError) as err:
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        raise ConfigError(f"{FLAG}: {text}") from None
    how = "merged" if merge else "unmerged"
    return dataclasses.replace(
        loaded, model=model, variables=variables, source=f"{loaded.source} + adapter {path} ({how})"
    )


__all__ = ["attach_adapter"]

"""Where ``dew chain`` records its config: ``OUTPUT/chain-config.json``.

``check_chain_output(output, config, base)`` records the config (``--set`` applied) on a
first run, with the config file's directory ``base`` under ``CONFIG_DIR`` (the relative paths
inside the config are read from there: ``dew generate`` and ``dew eval`` find a stage's
tokenizer through it), and, when the output's stage directories already hold checkpoints, refuses a config that
differs from the recorded one in any key but ``log_every``, naming the keys that differ
(dotted, list items by position: ``stages.1.steps``). A rerun of the same config resumes
unfinished stages and restores finished ones without training.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dew.recipes.schema import ConfigError

CHAIN_CONFIG = "chain-config.json"
#: The record's key holding the config file's directory (no config key starts with ``_``).
CONFIG_DIR = "_config_dir"
#: Keys a rerun may change without retraining anything.
_MAY_CHANGE = {"log_every", CONFIG_DIR}


def _differences(old: Any, new: Any, where: str = "") -> list[str]:
    """The dotted keys whose values differ between two config mappings."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{where}.{key}" if where else str(key)
            if path in _MAY_CHANGE:
                continue
            out += _differences(old.get(key), new.get(key), path)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            d for i, (a, b) in enumerate(zip(old, new)) for d in _differences(a, b, f"{where}.{i}")
        ]
    return [] if old == new else [where or "(the whole config)"]


def check_chain_output(output: Path, config: Mapping[str, Any], base: Path) -> None:
    """Refuse to continue an output directory whose stages were trained from another config
    (naming the keys that differ); record the config and its directory ``base`` on a first
    run."""
    from dew.files import atomic_write
    from dew.trainer.checkpoint import list_checkpoints

    record = output / CHAIN_CONFIG
    trained = output.is_dir() and any(
        list_checkpoints(stage) for stage in output.iterdir() if stage.is_dir()
    )
    if record.is_file() and trained:
        try:
            old = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"output: {record} is unreadable ({err})") from None
        changed = _differences(old, {**json.loads(json.dumps(config)), CONFIG_DIR: None})
        if changed:
            raise ConfigError(
                f"output: {output} holds stages trained with another config ({', '.join(changed)} "
                "differ); pass the same config, --fresh to move the old run aside, or another "
                "output"
            )
        return
    if trained:  # made by Recipe.run from Python, which records no config: adopt it, say so
        print(
            f"dew: warning: {output} holds checkpoints but no {CHAIN_CONFIG}; continuing them "
            "and recording this config (--fresh moves them aside instead)",
            file=sys.stderr,
            flush=True,
        )
    output.mkdir(parents=True, exist_ok=True)
    with atomic_write(record, "w") as f:
        record_config = {**config, CONFIG_DIR: str(Path(base).resolve())}
        f.write(json.dumps(record_config, indent=1, sort_keys=True, default=str) + "\n")


__all__ = ["CHAIN_CONFIG", "CONFIG_DIR", "check_chain_output"]

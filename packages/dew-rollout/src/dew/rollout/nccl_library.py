"""The few NCCL calls a weight push needs, behind one small interface.

`NCCLLibrary` is the interface `NCCLPush` talks to; `CtypesNCCL` implements it with
`ctypes` over a `libnccl.so.2` (use the engine's own copy: NCCL refuses a peer of another
version) and JAX device arrays as buffers, so the trainer needs no torch. Tests drive
`NCCLPush` with a recording implementation of the same interface.

Handshake (vLLM 0.32.0, `vllm/distributed/weight_transfer/nccl_common.py`): the engine
joins a unique-id group with `ncclCommInitRank` and then runs a one-element float32 sum
all-reduce as a warm-up; a foreign peer must issue the matching all-reduce before any
other collective, which `warm_up` does.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol, runtime_checkable

import numpy as np

UNIQUE_ID_BYTES = 128
# ncclDataType_t values from nccl.h.
_NCCL_DTYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
}
_NCCL_SUM = 0


class NCCLError(RuntimeError):
    """An NCCL call returned an error code; the message names the call."""


@runtime_checkable
class NCCLLibrary(Protocol):
    """What `NCCLPush` needs from NCCL and the device.

    `unique_id()` -> the 128 bytes of `ncclGetUniqueId`. `join(world_size, unique_id,
    rank)` -> a communicator handle, after `ncclCommInitRank`. `warm_up(comm)`: the
    one-element all-reduce the engine side expects. `upload(array)` -> a device buffer
    holding a host array; `broadcast(comm, buffer, root)` sends it (enqueued, not
    waited for); `synchronize()` waits for every enqueued send; `release(buffer)` frees
    it. `abort(comm)` tears a group down without waiting for the peers.
    """

    def unique_id(self) -> bytes: ...

    def join(self, world_size: int, unique_id: bytes, rank: int) -> Any: ...

    def warm_up(self, comm: Any) -> None: ...

    def upload(self, array: np.ndarray) -> Any: ...

    def broadcast(self, comm: Any, buffer: Any, root: int) -> None: ...

    def synchronize(self) -> None: ...

    def release(self, buffer: Any) -> None: ...

    def abort(self, comm: Any) -> None: ...


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * UNIQUE_ID_BYTES)]


class CtypesNCCL:
    """`NCCLLibrary` over `libnccl.so.2` through ctypes, with buffers as JAX arrays on
    `device` (default: the first GPU) and NCCL work on the default CUDA stream.

    Not exercised by dew-rollout's CPU test suite: it needs a GPU and an NCCL peer.
    """

    def __init__(self, path: str, device: Any = None) -> None:
        import jax

        self._lib = ctypes.CDLL(path)
        self._device = device if device is not None else jax.devices("gpu")[0]
        self._lib.ncclGetErrorString.restype = ctypes.c_char_p
        self._lib.ncclCommInitRank.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            _UniqueId,
            ctypes.c_int,
        ]

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            text = self._lib.ncclGetErrorString(code).decode()
            raise NCCLError(f"{call} failed with NCCL error {code}: {text}")

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self._check(self._lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(bytearray(uid.internal))

    def join(self, world_size: int, unique_id: bytes, rank: int) -> Any:
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"unique_id: expected {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        uid = _UniqueId()
        ctypes.memmove(uid.internal, unique_id, UNIQUE_ID_BYTES)
        comm = ctypes.c_void_p()
        self._check(
            self._lib.ncclCommInitRank(ctypes.byref(comm), world_size, uid, rank),
            "ncclCommInitRank",
        )
        return comm

    def warm_up(self, comm: Any) -> None:
        buffer = self.upload(np.zeros(1, np.float32))
        pointer = ctypes.c_void_p(buffer.unsafe_buffer_pointer())
        self._check(
            self._lib.ncclAllReduce(
                pointer, pointer, ctypes.c_size_t(1), _NCCL_DTYPES["float32"], _NCCL_SUM, comm, None
            ),
            "ncclAllReduce",
        )
        self.synchronize()

    def upload(self, array: np.ndarray) -> Any:
        import jax

        return jax.block_until_ready(jax.device_put(array, self._device))

    def broadcast(self, comm: Any, buffer: Any, root: int) -> None:
        name = str(buffer.dtype)
        if name not in _NCCL_DTYPES:
            raise ValueError(f"buffer: NCCL has no type for dtype {name}")
        pointer = ctypes.c_void_p(buffer.unsafe_buffer_pointer())
        self._check(
            self._lib.ncclBroadcast(
                pointer, pointer, ctypes.c_size_t(buffer.size), _NCCL_DTYPES[name], root, comm, None
            ),
            "ncclBroadcast",
        )

    def synchronize(self) -> None:
        # Device arrays are ready before their send; this waits for the sends themselves.
        for runtime in ("libcudart.so.12", "libcudart.so"):
            try:
                cudart = ctypes.CDLL(runtime)
            except OSError:
                continue
            code = cudart.cudaDeviceSynchronize()
            if code != 0:
                raise NCCLError(f"cudaDeviceSynchronize failed with CUDA error {code}")
            return
        raise NCCLError("synchronize: no libcudart found to wait for the NCCL sends")

    def release(self, buffer: Any) -> None:
        buffer.delete()

    def abort(self, comm: Any) -> None:
        self._check(self._lib.ncclCommAbort(comm), "ncclCommAbort")

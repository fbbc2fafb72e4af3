"""`RecordingNCCL`: an `NCCLLibrary` that keeps what it was asked to do, for `NCCLPush` tests
without a GPU (the real `CtypesNCCL` needs one and an NCCL peer)."""

from __future__ import annotations

import threading

import numpy as np


class Buffer:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array.copy()
        self.alive = True


class RecordingNCCL:
    """An `NCCLLibrary` that keeps what it was asked to do."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple] = []
        self.sent: dict[str, list[np.ndarray]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.comms = 0

    def unique_id(self) -> bytes:
        return bytes(range(128))

    def join(self, world_size: int, unique_id: bytes, rank: int):
        with self.lock:
            self.comms += 1
            comm = f"comm{self.comms}"
            self.events.append(("join", world_size, unique_id, rank, comm))
            self.sent[comm] = []
        return comm

    def warm_up(self, comm) -> None:
        self.events.append(("warm_up", comm))

    def upload(self, array: np.ndarray) -> Buffer:
        with self.lock:
            self.live_bytes += array.nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return Buffer(array)

    def broadcast(self, comm, buffer: Buffer, root: int) -> None:
        assert buffer.alive and root == 0
        self.sent[comm].append(buffer.array)

    def synchronize(self) -> None:
        self.events.append(("synchronize",))

    def release(self, buffer: Buffer) -> None:
        with self.lock:
            assert buffer.alive
            buffer.alive = False
            self.live_bytes -= buffer.array.nbytes

    def abort(self, comm) -> None:
        self.events.append(("abort", comm))

"""Shape buckets and a counted cache of ahead-of-time compiled programs.

Generation pads prompt widths, response budgets and batch sizes up to a few
bucket sizes so that calls with different lengths reuse one program; every
program is compiled explicitly (`jit(...).lower(...).compile()`) through
`ProgramCache`, which counts compilations and the seconds spent on them so
tests and benchmarks can check that nothing recompiles per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax


def bucket(n: int, minimum: int = 16, maximum: int | None = None) -> int:
    """The smallest power of two >= max(n, minimum), capped at `maximum` when given."""
    size = max(minimum, 1)
    while size < n:
        size *= 2
    if maximum is not None:
        size = min(size, maximum)
    return size


class ProgramCache:
    """Compiled executables keyed by an arbitrary hashable (shapes and static options)."""

    def __init__(self) -> None:
        self._programs: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.compile_count = 0
        self.compile_seconds = 0.0

    def get(
        self,
        key: Hashable,
        build: Callable[[], Callable[..., Any]],
        args: tuple[Any, ...],
        donate_argnums: tuple[int, ...] = (),
    ) -> Any:
        """The executable for `key`, compiling `build()` on `args` the first time."""
        with self._lock:
            program = self._programs.get(key)
            if program is None:
                start = time.perf_counter()
                program = jax.jit(build(), donate_argnums=donate_argnums).lower(*args).compile()
                self.compile_seconds += time.perf_counter() - start
                self.compile_count += 1
                self._programs[key] = program
            return program


class CompileStats:
    """``compile_count`` and ``compile_seconds`` of an object's ``programs`` (a ``ProgramCache``)."""

    programs: ProgramCache

    @property
    def compile_count(self) -> int:
        """How many programs were compiled so far."""
        return self.programs.compile_count

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling them."""
        return self.programs.compile_seconds

"""The machine a quickstart run's numbers came from, for ``summary.json``.

XLA compiles different CPU code for different vector units (AVX2, AVX-512, AMX) and the
rounding of sums and products follows that code, so two kinds of CPU train the same seed
to different (equally valid) results. The record names the kind: the CPU model, the ISA
flags that change XLA's code, the core count, the JAX versions and any ``XLA_FLAGS`` (for
example ``--xla_cpu_max_isa=AVX2``, which caps the instructions XLA may emit).

``machine_record()`` never raises: a field it cannot read is ``"unknown"`` or empty.
"""

from __future__ import annotations

import os
import platform
from typing import Any

# /proc/cpuinfo flags that decide XLA's CPU code path.
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_kind(flags: set[str]) -> str:
    """``"avx512+amx"``, ``"avx512"``, ``"avx2"`` or ``"older"`` from cpuinfo flags."""
    if "avx512f" in flags:
        return "avx512+amx" if "amx_tile" in flags else "avx512"
    return "avx2" if "avx2" in flags else "older"


def machine_record() -> dict[str, Any]:
    """CPU model and kind, its ISA flags, cores, platform, jax/jaxlib versions, XLA_FLAGS."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    try:
        import jax
        import jaxlib

        versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    except Exception:  # pragma: no cover - the quickstart imports jax before writing this
        versions = {"jax": "unknown", "jaxlib": "unknown"}
    return {
        "cpu_model": model,
        "cpu_kind": cpu_kind(flags),
        "isa_flags": sorted(flags & set(ISA_FLAGS)),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }

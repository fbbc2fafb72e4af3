"""Safetensors reading and writing through the `safetensors` library's numpy API.

`safetensors.safe_open(path, framework="numpy")` reads the header and each tensor (bfloat16
arrives as an `ml_dtypes.bfloat16` array); `safetensors.numpy.save_file` writes, here into a
temporary file that is fsynced and moved into place with `os.replace`. What this module adds
is the error a person can act on: a truncated or malformed file raises `SafetensorsError`
naming the file and what is wrong (the library's own message, which says which part of the
header or data failed), and a tensor whose dtype Dew cannot use names the tensor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np
import safetensors
from safetensors.numpy import save_file

from dew.files import atomic_path

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class SafetensorsError(ValueError):
    """A malformed, truncated or unsupported safetensors file."""


def _open(path: str | os.PathLike[str]) -> safetensors.safe_open:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such safetensors file")
    if os.path.getsize(path) < 8:
        raise SafetensorsError(
            f"{path}: {os.path.getsize(path)} bytes, too short to be a safetensors file"
        )
    try:
        return safetensors.safe_open(os.fspath(path), framework="numpy")
    except (safetensors.SafetensorError, OSError, ValueError) as error:
        raise SafetensorsError(f"{path}: not a readable safetensors file ({error})") from None


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, dict], int]:
    """``({name: {"dtype", "shape"}}, 0)``: every tensor's dtype code and shape.

    (The second value, once the data offset, is kept for callers of the old signature.)
    """
    with _open(path) as handle:
        header = {}
        for name in handle.keys():
            piece = handle.get_slice(name)
            header[name] = {"dtype": piece.get_dtype(), "shape": list(piece.get_shape())}
    return header, 0


def load(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Read tensors (all, or `names`) from `path` as numpy arrays.

    Raises `SafetensorsError` naming the file and tensor for a missing tensor or one whose
    dtype is not among `DTYPES`.
    """
    out: dict[str, np.ndarray] = {}
    with _open(path) as handle:
        present = set(handle.keys())
        for name in list(present) if names is None else list(names):
            if name not in present:
                raise SafetensorsError(f"{path}: no tensor named {name!r}")
            code = handle.get_slice(name).get_dtype()
            if code not in DTYPES:
                raise SafetensorsError(
                    f"{path}: tensor {name!r} has dtype {code!r}; supported: {sorted(DTYPES)}"
                )
            try:
                out[name] = np.array(handle.get_tensor(name), dtype=DTYPES[code], copy=True)
            except (safetensors.SafetensorError, OSError, ValueError) as error:
                raise SafetensorsError(f"{path}: tensor {name!r} is unreadable ({error})") from None
    return out


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors dtype code of a numpy dtype."""
    dtype = np.dtype(dtype)
    if dtype not in _NAMES:
        raise SafetensorsError(f"dtype {dtype} cannot be written to safetensors")
    return _NAMES[dtype]


def save(
    tensors: Mapping[str, np.ndarray],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` to `path` atomically (temporary file, fsync, `os.replace`)."""
    arrays = {}
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        dtype_code(array.dtype)  # refuse what safetensors cannot hold, naming the dtype
        arrays[name] = array
    with atomic_path(path) as temp:
        save_file(arrays, temp, metadata=dict(metadata or {"format": "pt"}))

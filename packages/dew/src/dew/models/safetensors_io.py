"""Minimal safetensors reader and writer over numpy (bfloat16 included).

The `safetensors` package's numpy backend cannot read BF16 tensors, which most
checkpoints use, so this module implements the (small) file format directly:
an 8-byte little-endian header length, a JSON header mapping each name to
`{"dtype", "shape", "data_offsets"}` (plus optional `"__metadata__"`), then the
raw little-endian bytes. Format: https://github.com/huggingface/safetensors
(README, "Format"). Reading memory-maps the file; writing goes to a temporary
file that is moved into place with `os.replace`.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

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
    """A malformed or unsupported safetensors file."""


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, dict], int]:
    """The tensor entries of `path` (without `__metadata__`) and the data start offset."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > 100_000_000:
            raise SafetensorsError(f"{path}: header length {size} is not plausible")
        try:
            header = json.loads(handle.read(size))
        except json.JSONDecodeError as error:
            raise SafetensorsError(f"{path}: header is not JSON ({error})") from error
    header.pop("__metadata__", None)
    return header, 8 + size


def load(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Read tensors (all, or `names`) from `path` as numpy arrays (copies).

    Raises `SafetensorsError` naming the tensor for an unknown dtype or a
    byte range that does not match its shape.
    """
    header, start = read_header(path)
    wanted = list(header) if names is None else list(names)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        if name not in header:
            raise SafetensorsError(f"{path}: no tensor named {name!r}")
        entry = header[name]
        code = entry.get("dtype")
        if code not in DTYPES:
            raise SafetensorsError(
                f"{path}: tensor {name!r} has dtype {code!r}; supported: {sorted(DTYPES)}"
            )
        dtype = DTYPES[code]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != expected or start + end > data.size:
            raise SafetensorsError(
                f"{path}: tensor {name!r} of shape {shape} and dtype {code} needs "
                f"{expected} bytes, the header gives {end - begin}"
            )
        chunk = np.asarray(data[start + begin : start + end])
        out[name] = chunk.view(dtype.newbyteorder("<")).reshape(shape).astype(dtype, copy=True)
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
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        nbytes = array.nbytes
        header[name] = {
            "dtype": dtype_code(array.dtype),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        arrays.append(array)
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(temp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as handle:
            handle.write(struct.pack("<Q", len(encoded)))
            handle.write(encoded)
            for array in arrays:
                handle.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise

"""dew.models.safetensors_io over the safetensors library: round trips (bfloat16 included),
files the library itself reads, and errors naming the file for broken ones."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from dew.models.safetensors_io import SafetensorsError, load, read_header, save


def test_round_trip_with_bfloat16_read_by_the_library(tmp_path):
    tensors = {
        "w": (np.arange(6, dtype=np.float32).reshape(2, 3) / 3).astype(ml_dtypes.bfloat16),
        "b": np.linspace(-1, 1, 5, dtype=np.float32),
        "n": np.array([1, -2], np.int64),
    }
    path = tmp_path / "m.safetensors"
    save(tensors, path)
    back = load(path)
    for name, array in tensors.items():
        assert back[name].dtype == array.dtype
        np.testing.assert_array_equal(back[name], array)
    assert read_header(path)[0] == {
        "b": {"dtype": "F32", "shape": [5]},
        "n": {"dtype": "I64", "shape": [2]},
        "w": {"dtype": "BF16", "shape": [2, 3]},
    }
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_broken_files_name_the_file_and_the_problem(tmp_path):
    good = tmp_path / "good.safetensors"
    save({"w": np.ones((4, 4), np.float32)}, good)
    data = good.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-10])
    with pytest.raises(
        SafetensorsError,
        match=r"cut.safetensors: not a readable safetensors file \(.*not fully covered",
    ):
        load(cut)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not}...")
    with pytest.raises(
        SafetensorsError,
        match=r"bad.safetensors: not a readable safetensors file \(.*invalid JSON in header",
    ):
        read_header(bad)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"abc")
    with pytest.raises(
        SafetensorsError, match=r"short.safetensors: 3 bytes, too short to be a safetensors file"
    ):
        load(short)
    with pytest.raises(FileNotFoundError, match=r"none.safetensors: no such safetensors file"):
        load(tmp_path / "none.safetensors")
    with pytest.raises(SafetensorsError, match=r"good.safetensors: no tensor named 'v'"):
        load(good, ["v"])
    odd = tmp_path / "odd.safetensors"
    save_file({"u": np.ones(2, np.uint16)}, str(odd))
    with pytest.raises(SafetensorsError, match=r"odd.safetensors: tensor 'u' has dtype 'U16'"):
        load(odd)
    with pytest.raises(SafetensorsError, match=r"dtype complex64 cannot be written"):
        save({"c": np.ones(2, np.complex64)}, tmp_path / "c.safetensors")

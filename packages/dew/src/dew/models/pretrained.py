"""Load and save Hugging Face decoder checkpoints.

`load_pretrained(directory)` reads `config.json` and either `model.safetensors`
or the shards listed by `model.safetensors.index.json`, and returns a
`Pretrained` with `.model` (a `CausalTransformer`), `.variables`
(`{"params": ...}`, float32) and `.config` (`DecoderConfig`). `.hf_config` keeps
the original config.json mapping so that saving preserves fields Dew does not
use (token ids, generation defaults).

`Pretrained.save(directory, dtype=...)` writes the same layout with the Hugging
Face tensor names, so transformers, vLLM and SGLang can read it. Files are
written into a temporary folder beside `directory` and each is moved in with
`os.replace`; weights first, config.json last, and stale shards of an earlier
save are removed afterwards. `Pretrained.export(dtype=...)` yields the same
`(name, array)` pairs without touching the disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from dew.files import write_json
from dew.models import safetensors_io
from dew.models.config import DecoderConfig, dtype_name
from dew.models.decoder import CausalTransformer
from dew.models.hf_names import TensorSpec, decoder_config, hf_config, tensor_specs

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_SAVE_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
_FLOAT_CODES = ("F32", "BF16", "F16", "F64")


class CheckpointError(ValueError):
    """A checkpoint that does not match what its config.json promises."""


def _read_json(path: Path) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{path}: not found (expected a Hugging Face layout)") from error


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> file that holds it."""
    index_path = directory / INDEX
    if index_path.exists():
        index = _read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, Mapping):
            raise CheckpointError(f"{index_path}: expected a 'weight_map' mapping")
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / SINGLE
    if single.exists():
        header, _ = safetensors_io.read_header(single)
        return {name: single for name in header}
    if any(directory.glob("*.bin")):
        raise CheckpointError(
            f"{directory}: only PyTorch .bin weights found; convert them to safetensors"
        )
    raise FileNotFoundError(f"{directory}: neither {SINGLE} nor {INDEX} found")


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _expected_shape(spec: TensorSpec, params_shapes: Mapping) -> tuple[int, ...]:
    shape = tuple(_get(params_shapes, spec.path).shape)
    return shape[::-1] if spec.transpose else shape


def load_pretrained(directory: str | os.PathLike[str], *, dtype: Any = "float32") -> Pretrained:
    """Read a Hugging Face decoder checkpoint (config.json + safetensors).

    dtype: the compute dtype of the returned model; parameters are always
    float32 jax arrays, and no host copy of them outlives the call (each
    tensor's numpy array is dropped once converted: loading holds about one
    host copy of a file at a time, not two). Raises naming the tensor when one
    is missing, has the wrong shape or a non-float dtype; unknown architectures name config.json's field.
    Extra tensors that Dew does not use (rotary caches) are ignored, except an
    `lm_head.weight` in a tied checkpoint, which must equal the embedding.
    """
    directory = Path(directory)
    hf = _read_json(directory / "config.json")
    family, config = decoder_config(hf, dtype=dtype_name(dtype))
    model = CausalTransformer(config)
    files = _weight_files(directory)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((1, 1), np.int32)))[
        "params"
    ]
    by_file: dict[Path, list[TensorSpec]] = {}
    for spec in tensor_specs(config):
        if spec.name not in files:
            raise CheckpointError(f"{directory}: tensor {spec.name!r} is missing")
        by_file.setdefault(files[spec.name], []).append(spec)
    params: dict = {}
    for path, specs in by_file.items():
        header, _ = safetensors_io.read_header(path)
        for spec in specs:
            if spec.name not in header:
                raise CheckpointError(f"{path}: tensor {spec.name!r} is missing")
            code = header[spec.name]["dtype"]
            if code not in _FLOAT_CODES:
                raise CheckpointError(
                    f"{path}: tensor {spec.name!r} has dtype {code}; expected a float "
                    f"({', '.join(_FLOAT_CODES)})"
                )
            expected = _expected_shape(spec, shapes)
            got = tuple(header[spec.name]["shape"])
            if got != expected:
                raise CheckpointError(
                    f"{path}: tensor {spec.name!r} has shape {got}, config.json implies {expected}"
                )
        arrays = safetensors_io.load(path, [spec.name for spec in specs])
        for spec in specs:  # one host tensor at a time, freed once its jax array is made
            array = arrays.pop(spec.name).astype(np.float32, copy=False)
            _set(params, spec.path, jax.numpy.asarray(array.T if spec.transpose else array))
    if config.tie_embeddings and "lm_head.weight" in files:
        head = safetensors_io.load(files["lm_head.weight"], ["lm_head.weight"])["lm_head.weight"]
        if not np.array_equal(head.astype(np.float32), params["embed_tokens"]["embedding"]):
            raise CheckpointError(
                f"{directory}: tensor 'lm_head.weight' differs from the embedding although "
                "tie_word_embeddings is true"
            )
    variables = {"params": params}
    return Pretrained(model=model, variables=variables, config=config, family=family, hf_config=hf)


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A decoder, its variables and its configuration.

    model: `CausalTransformer`. variables: `{"params": ...}`. config:
    `DecoderConfig`. family: the registry family ("llama", "qwen3", ...), which
    picks the Hugging Face architecture on save. hf_config: the config.json
    mapping it came from (empty for a model built in Dew).
    """

    model: CausalTransformer
    variables: Mapping[str, Any]
    config: DecoderConfig
    family: str = "causal_transformer"
    hf_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_model(
        cls, model: CausalTransformer, variables: Mapping[str, Any], family: str | None = None
    ) -> Pretrained:
        """Wrap a model built with `models.build` (family defaults to qwen3 when
        the config has q/k norm, qwen2 with attention bias, llama otherwise)."""
        config = model.config
        if family is None:
            family = "qwen3" if config.qk_norm else "qwen2" if config.attention_bias else "llama"
        return cls(model=model, variables=variables, config=config, family=family)

    def replace(self, **changes: Any) -> Pretrained:
        """A copy with fields changed, typically `variables=` after training."""
        return dataclasses.replace(self, **changes)

    def export(self, dtype: Any = "bfloat16") -> Iterator[tuple[str, np.ndarray]]:
        """Yield `(hf_name, array)` in checkpoint layout and `dtype`, one tensor at a time."""
        target = _SAVE_DTYPES[dtype_name(dtype)]
        params = self.variables["params"]
        for spec in tensor_specs(self.config):
            try:
                leaf = _get(params, spec.path)
            except KeyError as error:
                raise CheckpointError(
                    f"variables: no parameter at {'/'.join(spec.path)} for tensor {spec.name!r}"
                ) from error
            array = np.asarray(jax.device_get(leaf))
            if not np.issubdtype(array.dtype, np.floating) and array.dtype != ml_dtypes.bfloat16:
                raise CheckpointError(
                    f"variables: parameter for {spec.name!r} has dtype {array.dtype}, expected float"
                )
            array = array.astype(np.float32).astype(target)
            yield spec.name, np.ascontiguousarray(array.T if spec.transpose else array)

    def save(
        self,
        directory: str | os.PathLike[str],
        dtype: Any = "bfloat16",
        max_shard_bytes: int | None = None,
    ) -> Path:
        """Write config.json and safetensors weights (sharded with an index when
        `max_shard_bytes` is given and exceeded) to `directory`, atomically per file."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        name = dtype_name(dtype)
        tensors = dict(self.export(name))
        shards: list[dict[str, np.ndarray]] = [{}]
        size = 0
        for key, array in tensors.items():
            if max_shard_bytes is not None and shards[-1] and size + array.nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][key] = array
            size += array.nbytes
        config = hf_config(self.config, self.family, self.hf_config)
        config["dtype"] = name
        config.pop("torch_dtype", None)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            written = []
            if len(shards) == 1:
                safetensors_io.save(shards[0], staging / SINGLE)
                written.append(SINGLE)
            else:
                weight_map = {}
                for i, shard in enumerate(shards):
                    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                    safetensors_io.save(shard, staging / file)
                    written.append(file)
                    weight_map.update({key: file for key in shard})
                total = sum(a.nbytes for a in tensors.values())
                index = {"metadata": {"total_size": total}, "weight_map": weight_map}
                write_json(staging / INDEX, index, indent=2, sort_keys=True)
                written.append(INDEX)
            write_json(staging / "config.json", config, indent=2, sort_keys=True)
            written.append("config.json")
            directory.mkdir(exist_ok=True)
            stale = _previous_weight_files(directory)
            for file in written:
                os.replace(staging / file, directory / file)
            for file in stale - set(written):
                (directory / file).unlink(missing_ok=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return directory


def _previous_weight_files(directory: Path) -> set[str]:
    found = {p.name for p in directory.glob("model-*-of-*.safetensors")}
    for name in (SINGLE, INDEX):
        if (directory / name).exists():
            found.add(name)
    return found

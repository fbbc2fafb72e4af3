"""`engine_server`: a rollout server over a vLLM or SGLang engine Dew starts or joins.

Two ways in:

* `url` given: the engine already runs at that root URL, launched on the checkpoint
  `directory`; its `config.json` must describe a decoder of the policy's shape (every
  push rewrites that directory, and an engine reloads only the shape it started with),
  and the served model is the one `/v1/models` lists. The policy is pushed as version 0
  before the first draw, so the engine serves Dew's weights from the start. A vLLM engine
  must run with `--skip-tokenizer-init --logprobs-mode processed_logprobs` and
  `VLLM_SERVER_DEV_MODE=1` (see `dew.rollout.launch`).
* `url` None: Dew writes the policy in bfloat16 to `RUN_DIR/engine/policy` (what a push
  writes) and starts the engine there with `dew.rollout.launch.launch_engine` (the
  `launch` mapping, `--dtype` the policy's compute dtype, `--max-model-len` its
  `max_seq_len` unless `launch.max_model_len` says otherwise). The engine starts serving
  version 0, so nothing is pushed before the first draw.

Draws come through `OpenAIRolloutServer` over `OpenAICompletion` (token ids in and out),
pushes through `Publication(SafetensorsReload(...))` (publish "reload") or, on vLLM only,
`Publication(NCCLPush(...))` (publish "nccl": a broadcast from the trainer's GPU over an
NCCL group the engine joins; a launched engine gets `--weight-transfer-config
{"backend": "nccl"}`, one Dew joins must have been started with it). NCCL needs
`nccl_library`, the path of the engine's own `libnccl.so.2` (NCCL refuses a peer of
another version), and a GPU visible to JAX; without one the push is refused by name
before anything starts. Everything opened (the HTTP client, the server, the NCCL groups,
a launched engine) is closed by `stack`, the engine last.

With `lora` (a `LoraConfig`, vLLM and publish "reload" only) the policy trains an adapter:
`params` are its variables (`{"params": adapter, "base": base}`). The base alone is the
engine's checkpoint (written for a launched engine, which gets `lora_rank=lora.rank`),
and every push, version 0 included, goes through `AdapterReload`: the adapter is loaded
under `<served>-lora-v<version>` and draws name it, the base never rewritten. An engine
joined at `url` must run with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`;
one whose load route answers 404 is refused naming `rollout.engine.url`.

The policy must map onto a Hugging Face architecture the engine loads: Llama, Mistral,
Qwen2 or Qwen3. A bare module's family is read from its config (`Pretrained.from_model`:
Qwen3 with q/k norm, Qwen2 with attention biases, else Llama); pass a `Pretrained` as
`model` to name it, and one of the `causal_transformer` family, or any with a logit
softcap, is refused naming `model.name`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np

from dew.models import Pretrained
from dew.models.hf_names import ARCHITECTURES, decoder_config, hf_config
from dew.models.lora import BASE, LoraConfig, LoraDecoder
from dew.recipes.schema import ConfigError
from dew.rollout.adapter_reload import LOAD, AdapterReload
from dew.rollout.errors import EngineHTTPError, PushFailed
from dew.rollout.launch import KINDS, SERVED_NAME, launch_engine
from dew.rollout.likelihood import check_completions
from dew.rollout.nccl import NCCLPush
from dew.rollout.nccl_library import CtypesNCCL
from dew.rollout.openai import OpenAICompletion, OpenAIRolloutServer
from dew.rollout.publication import Publication
from dew.rollout.reload import SafetensorsReload
from dew.sampling import Sampling

PUBLISH = ("reload", "nccl")
#: What a launched vLLM engine needs to take NCCL pushes (vLLM 0.32.0's `--weight-transfer-config`).
NCCL_ARGS = ("--weight-transfer-config", json.dumps({"backend": "nccl"}))
#: Decoder fields an engine's config.json must agree with the policy on.
SHAPE = ("vocab_size", "emb_features", "num_layers", "num_heads", "num_kv_heads", "head_dim",
         "mlp_features", "qk_norm", "attention_bias", "tie_embeddings", "sliding_window")  # fmt: skip


def served_policy(model: Any, params: Any, kind: str) -> Pretrained:
    """`model` and `params` as a `Pretrained` of a family `kind` can load; `params` may be
    the variables (`{"params": ...}`) or the bare parameter tree, on host or device."""
    if params is not None:
        variables = params if isinstance(params, Mapping) and "params" in params else {
            "params": params}  # fmt: skip
        variables = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), dict(variables))
    if isinstance(model, Pretrained):
        policy = model if params is None else model.replace(variables=variables)
    elif params is None:
        raise ValueError("params: expected the policy's variables, got None")
    else:
        policy = Pretrained.from_model(model, variables)
    if policy.family not in ARCHITECTURES.values():
        raise ConfigError(
            f"model.name: {kind} cannot serve the {policy.family} family (no Hugging Face "
            f"architecture); expected one of {sorted(set(ARCHITECTURES.values()))}"
        )
    try:
        hf_config(policy.config, policy.family, policy.hf_config)
    except ValueError as error:
        raise ConfigError(f"model.name: {kind} cannot serve this policy: {error}") from None
    return policy


def check_directory(directory: Any, policy: Pretrained) -> Path:
    """The served checkpoint `directory`, whose config.json must match `policy`'s shape."""
    if not isinstance(directory, (str, os.PathLike)):
        raise ConfigError(
            f"rollout.engine.directory: expected the checkpoint directory the engine at "
            f"rollout.engine.url was launched on, got {directory!r}"
        )
    path = Path(directory)
    try:
        hf = json.loads((path / "config.json").read_text())
        _, served = decoder_config(hf)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"rollout.engine.directory: expected a checkpoint with a decoder config.json, "
            f"got {path} ({error})"
        ) from None
    for name in SHAPE:
        want, got = getattr(policy.config, name), getattr(served, name)
        if want != got:
            raise ConfigError(
                f"rollout.engine.directory: expected a checkpoint of the policy's shape "
                f"({name}={want}), got {name}={got} in {path / 'config.json'}"
            )
    return path


def served_name(client: httpx.Client, url: str) -> str:
    """The one base model the engine's `/v1/models` lists (LoRA adapters, which vLLM
    lists with the base as their `parent`, are passed over)."""
    try:
        listed = client.get("/v1/models")
        listed.raise_for_status()
        names = [entry["id"] for entry in listed.json()["data"] if not entry.get("parent")]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"rollout.engine.url: expected a running engine, got {url} ({error})"
        ) from None
    if len(names) != 1:
        raise ConfigError(f"rollout.engine.url: expected an engine serving one model, got {names}")
    return str(names[0])


def adapter_names(client: httpx.Client) -> list[str]:
    """The LoRA adapters the engine's `/v1/models` lists (entries with a `parent`)."""
    listed = client.get("/v1/models")
    listed.raise_for_status()
    return [str(entry["id"]) for entry in listed.json()["data"] if entry.get("parent")]


def nccl(path: str) -> CtypesNCCL:
    """The NCCL library at `path` over the first GPU JAX sees; a `ConfigError` naming
    `rollout.engine.nccl_library` when it does not load or no GPU is visible."""
    try:
        return CtypesNCCL(path)
    except (OSError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"rollout.engine.nccl_library: expected a loadable libnccl.so.2 and a GPU visible "
            f"to JAX, got {path!r} ({reason})"
        ) from None


def _check_choice(kind: Any, publish: Any, url: Any, launch: Any, library: Any,
                  lora: Any = None) -> None:  # fmt: skip
    if kind not in KINDS:
        raise ConfigError(f"rollout.engine.kind: expected one of {list(KINDS)}, got {kind!r}")
    if lora is not None and kind != "vllm":
        raise ConfigError(f"rollout.engine.kind: a LoRA adapter needs an engine that loads "
                          f"adapters at run time; expected 'vllm', got {kind!r}")  # fmt: skip
    if lora is not None and publish != "reload":
        raise ConfigError(f"rollout.engine.publish: a LoRA adapter is pushed as files "
                          f"(AdapterReload); expected 'reload', got {publish!r}")  # fmt: skip
    if publish not in PUBLISH:
        raise ConfigError(
            f"rollout.engine.publish: expected one of {list(PUBLISH)}, got {publish!r}"
        )
    if publish == "nccl" and kind != "vllm":
        raise ConfigError(f"rollout.engine.publish: 'nccl' follows vLLM's weight-transfer "
                          f"routes; a {kind} engine takes 'reload'")  # fmt: skip
    if (publish == "nccl") != (library is not None):
        raise ConfigError(
            "rollout.engine.nccl_library: expected the path of the engine's libnccl.so.2 "
            f"with publish 'nccl' and nothing with 'reload', got {library!r} with {publish!r}"
        )
    if url is not None and launch is not None:
        raise ConfigError("rollout.engine.launch: expected no launch settings with a url, got both")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ConfigError(f"rollout.engine.url: expected an http(s) root URL, got {url!r}")


def lora_base(model: Any, params: Any) -> tuple[Any, Any]:
    """The base an adapter run serves: its plain decoder and `{"params": base}`, from a
    `LoraDecoder` (or any decoder) and LoRA variables `{"params": adapter, "base": base}`."""
    if not isinstance(params, Mapping) or BASE not in params or "params" not in params:
        got = sorted(params) if isinstance(params, Mapping) else type(params).__name__
        raise ValueError(f"params: expected LoRA variables with 'params' (the adapter) and "
                         f"{BASE!r} (the base), got {got}")  # fmt: skip
    plain = model.base_model() if isinstance(model, LoraDecoder) else model
    return plain, {"params": params[BASE]}


def first_adapter(publication: Publication, params: Any, url: str | None) -> None:
    """Push the starting adapter as version 0; an engine at `url` that has no adapter
    route (404: LoRA off) is a `ConfigError` naming `rollout.engine.url`."""
    try:
        publication.load(params, 0)
    except PushFailed as error:
        missing = [root for root, cause in error.failures.items()
                   if isinstance(cause, EngineHTTPError) and cause.status == 404
                   and "Not Found" in str(cause)]  # fmt: skip
        if url is None or not missing:
            raise
        raise ConfigError(
            f"rollout.engine.url: the engine at {url} has no {LOAD} route (HTTP 404); a lora "
            "run needs it started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
        ) from None


def engine_server(
    kind: str,
    *,
    url: str | None,
    directory: str | os.PathLike[str] | None,
    launch: Mapping[str, Any] | None,
    publish: str,
    model: Any,
    params: Any,
    sampling: Sampling,
    concurrency: int,
    run_dir: str | os.PathLike[str],
    stack: contextlib.ExitStack,
    nccl_library: str | None = None,
    lora: LoraConfig | None = None,
) -> OpenAIRolloutServer:
    """An `OpenAIRolloutServer` drawing from a `kind` engine ("vllm" or "sglang") at `url`,
    or launched by Dew when `url` is None, with weight pushes wired (module docstring).

    model, params: the policy (a flax `CausalTransformer` and its variables, or a
    `Pretrained`). sampling: the `Sampling` every draw uses (checked before any launch).
    concurrency: requests in flight. run_dir: holds `engine/policy` and `engine.log` of a
    launched engine. stack: closes the server, its client and the engine. nccl_library:
    the engine's `libnccl.so.2`, with publish "nccl" only. lora: the adapter's
    `LoraConfig` when the policy trains one (`params` then hold adapter and base).
    """
    _check_choice(kind, publish, url, launch, nccl_library, lora)
    check_completions(sampling, kind, processed_logprobs=True)
    base_model, base_params = (model, params) if lora is None else lora_base(model, params)
    policy = served_policy(base_model, base_params, kind)
    library = None if nccl_library is None else nccl(nccl_library)
    if url is not None:
        root = url.rstrip("/")
        folder = check_directory(directory, policy)
    else:
        folder = Path(run_dir) / "engine" / "policy"
        policy.save(folder, dtype="bfloat16")
        root = launch_engine(
            kind, folder, run_dir=run_dir, stack=stack, launch=launch,
            max_model_len=policy.config.max_seq_len, dtype=policy.config.dtype,
            args=NCCL_ARGS if library is not None else (),
            lora_rank=None if lora is None else lora.rank,
        )  # fmt: skip
    client = stack.enter_context(httpx.Client(base_url=root, timeout=300))
    name = served_name(client, root) if url is not None else SERVED_NAME
    push: Any
    if lora is not None:
        push = AdapterReload(policy.config, lora, Path(run_dir) / "engine" / "adapters",
                             [root], name, client=client,
                             taken=adapter_names(client) if url is not None else ())  # fmt: skip
    elif library is None:
        push = SafetensorsReload(policy, folder, [root], kind, client=client)
    else:
        push = NCCLPush(policy, [root], library, dtype="bfloat16", client=client)
        stack.callback(push.close)
    publication = Publication(push, version=0)
    if lora is not None:
        first_adapter(publication, params, url)
    elif url is not None:
        publication.load(policy.variables, 0)
    completion = OpenAICompletion(name, client, provider=kind)
    server = OpenAIRolloutServer(completion, sampling, publication, processed_logprobs=True,
                                 concurrency=concurrency)  # fmt: skip
    stack.callback(server.close)
    return server

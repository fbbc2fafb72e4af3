"""Sample from a trained model and score it: what ``dew generate`` and ``dew eval`` run.

``load_model`` reads each kind of model directory Dew writes:

* a ``dew train`` run directory (``RUN_DIR/config.json`` and ``RUN_DIR/checkpoints``): the
  model is rebuilt from the config's ``model`` section (a ``model.pretrained`` directory it
  names must still be there, for the architecture) and the policy weights are read from the
  newest valid checkpoint; the tokenizer defaults to the config's ``data.tokenizer``;
* a stage directory of ``dew chain`` (``OUTPUT/<stage>/checkpoints``, no ``config.json``):
  the model and the stage's kind come from ``OUTPUT/chain-config.json``, the tokenizer
  from the stage's ``data.tokenizer``; relative paths are read from the config file's
  directory, which the record holds (a record written before it did: the config's relative
  ``output`` taken off ``OUTPUT``); the weights of a stage that trained a LoRA adapter are
  its merged ones, ``OUTPUT/<stage>/merged`` (``dew.recipes.chain_lora``);
* an exported or Hugging Face directory (``config.json`` + safetensors, what ``dew train
  --export`` writes), read by ``dew.models.load_pretrained``; the tokenizer defaults to the
  directory itself when it holds ``tokenizer.json``.

A LoRA adapter on top of any of these (``--adapter DIR``, merged with ``--merge-adapter``)
is attached by ``dew.recipes.generate_adapter``.

``generate`` samples ``samples`` completions of every prompt of a ``dew.data.Prompts`` and
returns one record per completion; ``evaluate`` does the same and scores each completion
with a reward called as ``reward(data_source, completion, ground_truth, extra_info)``, as
GRPO calls it. The completion text is the tokenizer's decoding of the ids with a final EOS
id left out (without a tokenizer: the ids separated by spaces, like GRPO's default).

Randomness: completions are drawn in chunks of ``batch`` (prompt, sample) pairs, in row
order; chunk ``c`` samples with ``fold_in(key(seed), c)``. The same model, prompts, seed,
``batch`` and sampling settings give the same completions; greedy decoding (temperature 0)
does not depend on the seed or ``batch``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dew.recipes.chain_output import CONFIG_DIR
from dew.recipes.schema import ConfigError


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A decoder ready to sample: ``model`` (a ``CausalTransformer``), its ``variables``,
    the ``tokenizer`` (a ``ChatTokenizer``, or None for token-id prompts only), the default
    ``eos_id`` (the tokenizer's ``eos_token``, or None) and ``source``, a phrase naming
    where the weights came from (``run runs/sft step 500``)."""

    model: Any
    variables: Mapping[str, Any]
    tokenizer: Any
    eos_id: int | None
    source: str


def _read_json(path: str, where: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: {path} is unreadable ({err})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {path} holds no JSON object")
    return value


def _is_run_dir(path: str) -> bool:
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return True
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and "kind" in value and "run" in value


def _policy_variables(model: Any, restored: Any, kind: Any = None) -> Any:
    """The ``params`` field of a checkpointed ``TrainState`` (leaves 2.. after ``step`` and
    ``updates``), shaped like ``model``'s variables; refused when the shapes differ. The
    whole state is read (optimizer state too) and all but the policy is dropped. A PPO run
    (``kind == "ppo"``) keeps ``{"params": {"critic": ..., "policy": ...}}``: the critic's
    leaves (a ``ValueHead`` on the same decoder) come first and are skipped."""
    import jax

    from dew.trainer import checkpoint

    ids = np.zeros((1, 1), np.int32)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
    wanted, treedef = jax.tree.flatten(abstract)
    first = 2
    if kind == "ppo":
        from dew.objectives.rl import ValueHead

        critic = jax.eval_shape(lambda: ValueHead(model).init(jax.random.key(0), ids))
        first += len(jax.tree.leaves(critic))
    meta = restored.meta
    shapes = [tuple(s) for s in meta["shapes"]]
    if len(shapes) < first + len(wanted) or any(
        shapes[first + i] != tuple(leaf.shape) for i, leaf in enumerate(wanted)
    ):
        raise ConfigError(
            f"MODEL: checkpoint {restored.path} does not hold the weights of the model its "
            "run's config.json describes"
        )
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = [jax.ShapeDtypeStruct(s, np.dtype(d)) for s, d in zip(shapes, meta["dtypes"])]
    leaves = checkpoint.restore_into(template, [device] * len(template), restored)
    return jax.tree.unflatten(treedef, leaves[first : first + len(wanted)])


def _chain_stage(run_dir: str) -> dict[str, Any] | None:
    """The ``kind``, ``model`` and ``data`` of a ``dew chain`` stage directory as a run
    directory's config holds them, paths resolved (see the module docstring); None when
    ``run_dir`` has a ``config.json`` or its parent no ``chain-config.json``."""
    output = os.path.dirname(os.path.abspath(run_dir))
    record = os.path.join(output, "chain-config.json")
    if os.path.isfile(os.path.join(run_dir, "config.json")) or not os.path.isfile(record):
        return None
    chain = _read_json(record, "MODEL")
    name = os.path.basename(os.path.abspath(run_dir))
    stages = [s for s in chain.get("stages") or () if isinstance(s, dict) and s.get("name") == name]
    if not stages:
        raise ConfigError(f"MODEL: {record} names no stage {name!r}")
    base = chain.get(CONFIG_DIR)
    if not isinstance(base, str):  # recorded before the directory was: undo a plain output
        base, written = output, str(chain.get("output", ""))
        if written and not os.path.isabs(written):
            for _ in os.path.normpath(written).split(os.sep):
                base = os.path.dirname(base)

    def resolve(value: Any) -> Any:
        if not isinstance(value, str) or os.path.isabs(os.path.expanduser(value)):
            return value
        return os.path.join(base, value)

    model = dict(chain.get("model") or {})
    if chain.get("pretrained"):
        model["pretrained"] = chain["pretrained"]
    if model.get("pretrained"):
        model["pretrained"] = resolve(model["pretrained"])
    data = stages[0].get("data") or {}
    tokenizer = data.get("tokenizer") if isinstance(data, dict) else None
    return {
        "kind": stages[0].get("kind"),
        "model": model,
        "data": {"tokenizer": resolve(tokenizer)},
    }


def _load_run(run_dir: str) -> tuple[Any, Any, str | None, str]:
    from dew.recipes.builder import build_model, model_config
    from dew.trainer import checkpoint

    saved = _chain_stage(run_dir) or _read_json(os.path.join(run_dir, "config.json"), "MODEL")
    merged = os.path.join(run_dir, "merged")
    if os.path.isfile(os.path.join(merged, "config.json")):  # a dew chain stage's adapter
        from dew import models

        loaded = models.load_pretrained(merged, dtype="float32")
        tokenizer = (saved.get("data") or {}).get("tokenizer")
        return loaded.model, dict(loaded.variables), tokenizer, f"run {run_dir} (merged)"
    if isinstance(saved.get("lora"), dict):  # its checkpoints hold the adapter alone
        base = (saved.get("model") or {}).get("pretrained") or "its base model directory"
        raise ConfigError(
            f"MODEL: {run_dir} is a LoRA run (its checkpoints hold the adapter only): expected "
            f"the base as MODEL ({base}) with --adapter {os.path.join(run_dir, 'adapter')}"
        )
    restored = checkpoint.latest(run_dir)
    if restored is None:
        raise ConfigError(
            f"MODEL: run directory {run_dir} holds no checkpoint (RUN_DIR/checkpoints/step_*)"
        )
    model, _ = build_model(model_config(saved.get("model", {}), "MODEL config.json: model"))
    variables = _policy_variables(model, restored, saved.get("kind"))
    tokenizer = (saved.get("data") or {}).get("tokenizer")
    return model, variables, tokenizer, f"run {run_dir} step {restored.step}"


def load_model(path: str, *, tokenizer: Any = None, dtype: str | None = None) -> LoadedModel:
    """The model, weights and tokenizer of a run directory or an exported directory.

    ``tokenizer`` (a directory, a Hub name or a loaded ``ChatTokenizer``) overrides the
    default one (see the module docstring). ``dtype`` is the compute dtype of an exported
    directory's model (default float32; a run directory keeps its config's ``model.dtype``).
    Raises ``FileNotFoundError`` when ``path`` is missing, ``ConfigError`` (a ``ValueError``)
    when it is neither kind of directory or a run directory has no checkpoint.
    """
    from dew.data.chat.template import load_chat_tokenizer

    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"MODEL: no such directory {path!r}")
    default_tokenizer: str | None = None
    if _is_run_dir(path):
        model, variables, default_tokenizer, source = _load_run(path)
    elif os.path.isfile(os.path.join(path, "config.json")):
        from dew import models

        loaded = models.load_pretrained(path, dtype=dtype or "float32")
        model, variables, source = loaded.model, dict(loaded.variables), f"model {path}"
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            default_tokenizer = path
    else:
        raise ConfigError(
            f"MODEL: {path} is neither a dew train run directory (config.json + checkpoints/) "
            "nor a model directory (config.json + safetensors)"
        )
    spec = tokenizer if tokenizer is not None else default_tokenizer
    tok: Any = None
    if spec is not None:
        named = isinstance(spec, (str, os.PathLike))
        tok = load_chat_tokenizer(spec, "--tokenizer") if named else spec
    eos = getattr(tok, "special", {}).get("eos_token") if tok is not None else None
    eos_id = tok.tokenizer.token_to_id(eos) if eos else None
    return LoadedModel(model, variables, tok, eos_id, source)


def _with_room(model: Any, positions: int) -> Any:
    """``model`` covering at least ``positions`` positions (Dew's decoders are rotary: the
    limit holds no weights, so raising it changes no parameter); a ``LoraDecoder`` keeps
    its adapter config."""
    if model.config.max_seq_len >= positions:
        return model
    return model.clone(config=dataclasses.replace(model.config, max_seq_len=positions))


def _check_options(samples: int, batch: int, max_new_tokens: int) -> None:
    for name, value in (("samples", samples), ("batch", batch),
                        ("max_new_tokens", max_new_tokens)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")


def completion_text(loaded: LoadedModel, ids: Any, eos_ids: tuple[int, ...]) -> str:
    """The text a reward reads: ``ids`` without a final EOS id, decoded by the tokenizer
    (without one: the ids separated by spaces)."""
    from dew.rollouts.sampled import default_decode

    ids = [int(i) for i in ids]
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return loaded.tokenizer.decode(ids) if loaded.tokenizer is not None else default_decode(ids)


def generate(
    loaded: LoadedModel,
    prompts: Any,
    *,
    max_new_tokens: int,
    sampling: Any = None,
    samples: int = 1,
    seed: int = 0,
    batch: int = 16,
) -> list[dict[str, Any]]:
    """Sample ``samples`` completions of every row of ``prompts`` (a ``dew.data.Prompts``).

    ``sampling`` is a ``dew.Sampling`` (default: greedy, ending at ``loaded.eos_id``). One
    record per completion, in row order then sample order: ``row`` (the prompt's index),
    ``sample``, ``ids`` (the completion's ids, a final EOS id included), ``length`` (their
    number), ``finish_reason`` (``eos`` or ``length``: the budget ran out) and, when a
    tokenizer is known, ``text`` (see ``completion_text``).
    """
    import jax

    from dew.inference import TextGeneration
    from dew.inference.compiled import bucket
    from dew.sampling import Sampling

    _check_options(samples, batch, max_new_tokens)
    if sampling is None:
        sampling = Sampling(temperature=0.0, eos_id=loaded.eos_id)
    room = bucket(prompts.max_prompt_len) + bucket(max_new_tokens)
    sampler = TextGeneration(_with_room(loaded.model, room), loaded.variables)
    arrays = prompts.arrays
    width = prompts.max_prompt_len
    pairs = [(row, s) for row in range(len(prompts)) for s in range(samples)]
    records: list[dict[str, Any]] = []
    for chunk, start in enumerate(range(0, len(pairs), batch)):
        part = pairs[start : start + batch]
        contexts = [
            arrays["prompt"][row, width - int(arrays["prompt_length"][row]) :] for row, _ in part
        ]
        key = jax.random.fold_in(jax.random.key(seed), chunk)
        out = sampler(contexts, max_new_tokens, key, sampling)
        for (row, s), gen in zip(part, out):  # type: ignore[arg-type]
            record: dict[str, Any] = {"row": row, "sample": s, "ids": gen.ids.tolist(),
                                      "length": len(gen), "finish_reason": gen.finish_reason}  # fmt: skip
            if loaded.tokenizer is not None:
                record["text"] = completion_text(loaded, gen.ids, sampling.eos_ids)
            records.append(record)
    return records


def reward_needs(spec: str) -> tuple[str, ...]:
    """The prompt fields the reward ``spec`` names cannot score without (its ``needs``)."""
    from dew.recipes.references import load_reward

    return tuple(getattr(load_reward(spec, "--reward"), "needs", ()) or ())


def evaluate(
    loaded: LoadedModel,
    prompts: Any,
    reward: Callable[..., Any],
    *,
    max_new_tokens: int,
    sampling: Any = None,
    samples: int = 1,
    seed: int = 0,
    batch: int = 16,
) -> dict[str, Any]:
    """Generate as ``generate`` does and score every completion with ``reward``.

    Returns ``{"rows": records, "mean", "standard_error", "n"}``: each record of
    ``generate`` gains ``reward`` (a float); ``standard_error`` is ``sqrt(var / n)`` with the
    population variance of the ``n`` rewards (for 0/1 rewards the binomial
    ``sqrt(p (1 - p) / n)`` of ``dew.rewards.standard_error``). A reward that raises or
    returns no finite number raises ``dew.rollouts.RewardError`` naming the row.
    """
    from dew.data.prompts import decode_text
    from dew.rollouts.sampled import RewardError, default_decode

    records = generate(loaded, prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                       samples=samples, seed=seed, batch=batch)  # fmt: skip
    for record in records:
        row = record["row"]
        meta = [decode_text(prompts.arrays[f][row]) for f in
                ("data_source", "ground_truth", "extra_info")]  # fmt: skip
        text = record.get("text")
        if text is None:
            text = default_decode(record["ids"][:-1] if record["finish_reason"] == "eos"
                                  else record["ids"])  # fmt: skip
        try:
            value = reward(meta[0], text, meta[1], meta[2])
            number = float(value)
        except Exception as err:
            raise RewardError(
                f"reward: raised {type(err).__name__}: {err} for prompt row {row} "
                f"(completion {text!r})"
            ) from err
        if isinstance(value, bool) or not math.isfinite(number):
            raise RewardError(
                f"reward: expected a finite float for prompt row {row}, got {value!r}"
            )
        record["reward"] = number
    rewards = np.asarray([r["reward"] for r in records], np.float64)
    mean = float(rewards.mean())
    spread = float(np.sqrt(max(float(((rewards - mean) ** 2).mean()), 0.0) / len(rewards)))
    return {"rows": records, "mean": mean, "standard_error": spread, "n": len(records)}


__all__ = ["LoadedModel", "completion_text", "evaluate", "generate", "load_model",
           "reward_needs"]  # fmt: skip

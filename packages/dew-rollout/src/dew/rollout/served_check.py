"""The end of an asynchronous run: the engine is left serving the trained weights, and a vLLM
engine is asked to prove it.

The scheduler pushes weights before it draws, so when the trainer's last update lands the
engine still serves an older version. ``finish(scheduler, params, updates, run_dir)`` pushes
``params`` as version ``updates`` when the served version is older, so an engine that outlives
the run (one joined at ``rollout.engine.url``) serves what was trained.

On vLLM it then checks the push: a few probe rows of token ids (drawn from a fixed seed over
the model's vocabulary) are sent to the completions route with ``prompt_logprobs``, and the
engine's log-probability of every id after the first is compared with Dew's own for the same
weights as published (rounded to bfloat16, the dtype ``SafetensorsReload`` writes). The ids,
both sets of values and the largest absolute difference go to ``RUN_DIR/engine-check.json``
(written atomically) and one line is printed. SGLang's and the native server's pushes are
made but not probed (no prompt log-probability route is wired for them here).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The file the check writes under the run directory.
CHECK_FILE = "engine-check.json"
PROBES, PROBE_LENGTH, PROBE_SEED = 3, 12, 0


def probe_rows(vocab_size: int) -> list[list[int]]:
    """``PROBES`` rows of ``PROBE_LENGTH`` ids in ``[0, vocab_size)``, the same every run."""
    rng = np.random.default_rng(PROBE_SEED)
    return rng.integers(0, vocab_size, (PROBES, PROBE_LENGTH)).tolist()


def engine_prompt_log_probs(server: Any, ids: list[int]) -> np.ndarray:
    """vLLM's log-probability of each id after the first, ``[len(ids) - 1]`` float32 (the
    completions route with ``prompt_logprobs: 0`` returns the prompt's own ids)."""
    completion = server.completion
    body = {"model": server.served_model(completion.name), "prompt": ids, "max_tokens": 1,
            "prompt_logprobs": 0, "logprobs": 0, "return_tokens_as_token_ids": True}  # fmt: skip
    answer = completion.client.post("/v1/completions", json=body)
    answer.raise_for_status()
    entries = answer.json()["choices"][0]["prompt_logprobs"][1:]
    return np.asarray(
        [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)],
        np.float32,
    )


def published(variables: Any) -> dict[str, Any]:
    """``variables`` as the engine holds them: full weights rounded to bfloat16 (what
    ``SafetensorsReload`` writes); for LoRA variables the base rounded (the engine's
    bfloat16 checkpoint) and the adapter kept in float32 (``AdapterReload``'s files)."""

    def bf16(tree: Any) -> Any:
        return jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16).astype(np.float32),
                            tree)  # fmt: skip

    if "base" in variables:
        adapter = jax.tree.map(lambda x: np.asarray(x, np.float32), variables["params"])
        return {"params": adapter, "base": bf16(variables["base"])}
    return {"params": bf16(variables["params"])}


def dew_prompt_log_probs(model: Any, variables: Any, rows: list[list[int]]) -> list[np.ndarray]:
    """Dew's log-probability of each id after the first of every row (raw logits, no
    temperature), under ``variables`` (``{"params": ...}``, or LoRA variables with a
    ``base``) as a push publishes them (``published``)."""
    from dew.objectives.scoring import packed_log_probs

    ids = np.concatenate([np.asarray(r, np.int32) for r in rows])[None]
    segments = np.concatenate([np.full(len(r), i + 1, np.int32) for i, r in enumerate(rows)])
    positions = np.concatenate([np.arange(len(r), dtype=np.int32) for r in rows])
    batch = {"input_ids": jnp.asarray(ids), "text_segment_ids": jnp.asarray(segments[None]),
             "text_positions": jnp.asarray(positions[None])}  # fmt: skip
    scored = np.asarray(packed_log_probs(model, published(variables), batch, None))[0]
    out, start = [], 0
    for row in rows:
        out.append(scored[start + 1 : start + len(row)])
        start += len(row)
    return out


def finish(scheduler: Any, params: Any, updates: int, run_dir: str) -> dict[str, Any] | None:
    """Push ``params`` (the trainer's variables, ``{"params": ...}``, or the bare tree) as version
    ``updates`` when the engine serves an older one, then check a vLLM engine (module
    docstring). Returns what was written to ``RUN_DIR/engine-check.json``, or None when the
    engine is not probed."""
    from dew.files import atomic_write

    variables = params if isinstance(params, dict) and "params" in params else {"params": params}
    server = scheduler.weights
    if int(server.version) < updates:
        server.load(variables, updates)
    completion = getattr(server, "completion", None)
    if getattr(completion, "provider", None) != "vllm":
        return None
    model = scheduler.objective.model
    rows = probe_rows(int(model.config.vocab_size))
    ours = dew_prompt_log_probs(model, variables, rows)  # an adapter run: with its base
    theirs = [engine_prompt_log_probs(server, row) for row in rows]
    worst = max(float(np.abs(a - b).max()) for a, b in zip(theirs, ours, strict=True))
    check = {"version": int(server.version), "ids": rows,
             "engine": [t.tolist() for t in theirs], "dew": [o.tolist() for o in ours],
             "max_abs_difference": worst}  # fmt: skip
    with atomic_write(os.path.join(run_dir, CHECK_FILE), "w") as f:
        json.dump(check, f)
    print(f"dew: the engine serves version {check['version']}; its prompt log-probabilities "
          f"of {len(rows)} probe rows differ from Dew's by at most {worst:.3g}", flush=True)  # fmt: skip
    return check


__all__ = ["CHECK_FILE", "dew_prompt_log_probs", "engine_prompt_log_probs", "finish",
           "probe_rows", "published"]  # fmt: skip

"""``dew generate --canvas-steps N``: completions of a masked-diffusion checkpoint by
canvas generation (``dew.inference.canvas``) instead of left-to-right decoding.

Each prompt gets a canvas of ``max_new_tokens`` mask ids filled in ``canvas_steps`` steps
with ``remasking`` (``low_confidence``: LLaDA's; ``ancestral``: MDLM's sampler), block by
block when ``block_length`` is set (block-causally with ``block_causal``, for block
diffusion checkpoints). The mask id defaults to the model's last id (``vocab_size - 1``),
where ``dew train lm --objective masked_diffusion`` puts it when it grows the vocabulary;
prompt ids must lie below it. A record holds every generated id; ``finish_reason`` is
``eos`` when the canvas holds an EOS id (the text stops before it) and ``length`` otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dew.recipes.generate import LoadedModel, _check_options, _with_room


@dataclasses.dataclass(frozen=True)
class CanvasOptions:
    """The flags of a canvas run: steps, remasking, block_length, block_causal, mask_id
    (None: the model's last id)."""

    steps: int
    remasking: str = "low_confidence"
    block_length: int | None = None
    block_causal: bool = False
    mask_id: int | None = None


def _canvas(loaded: LoadedModel, options: CanvasOptions) -> Any:
    from dew.inference.canvas import Canvas

    vocab = loaded.model.config.vocab_size
    mask_id = vocab - 1 if options.mask_id is None else options.mask_id
    return Canvas(
        mask_id=mask_id,
        real_tokens=min(mask_id, vocab),
        steps=options.steps,
        remasking=options.remasking,
        block_length=options.block_length,
        block_causal=options.block_causal,
    )


def generate_canvas(
    loaded: LoadedModel,
    prompts: Any,
    options: CanvasOptions,
    *,
    max_new_tokens: int,
    sampling: Any = None,
    samples: int = 1,
    seed: int = 0,
    batch: int = 16,
) -> list[dict[str, Any]]:
    """One record per completion, in row then sample order, as ``generate`` writes them
    (``row``, ``sample``, ``ids``, ``length``, ``finish_reason``, ``text`` with a
    tokenizer); ``sampling`` a ``dew.Sampling`` (default: greedy, EOS ``loaded.eos_id``)."""
    import jax

    from dew.inference.canvas import CanvasGeneration
    from dew.sampling import Sampling

    _check_options(samples, batch, max_new_tokens)
    sampling = Sampling(temperature=0.0, eos_id=loaded.eos_id) if sampling is None else sampling
    model = _with_room(loaded.model, prompts.max_prompt_len + max_new_tokens)
    sampler = CanvasGeneration(model, loaded.variables, canvas=_canvas(loaded, options))
    arrays, width = prompts.arrays, prompts.max_prompt_len
    pairs = [(row, s) for row in range(len(prompts)) for s in range(samples)]
    records: list[dict[str, Any]] = []
    for chunk, start in enumerate(range(0, len(pairs), batch)):
        part = pairs[start : start + batch]
        contexts = [
            arrays["prompt"][row, width - int(arrays["prompt_length"][row]) :] for row, _ in part
        ]
        key = jax.random.fold_in(jax.random.key(seed), chunk)
        for (row, s), out in zip(part, sampler(contexts, max_new_tokens, key, sampling)):  # type: ignore[arg-type]
            text_ids = out.text_ids
            record: dict[str, Any] = {"row": row, "sample": s, "ids": out.ids.tolist(),
                                      "length": int(out.ids.size),
                                      "finish_reason": "eos" if text_ids.size < out.ids.size
                                      else "length"}  # fmt: skip
            if loaded.tokenizer is not None:
                record["text"] = loaded.tokenizer.decode([int(i) for i in text_ids])
            records.append(record)
    return records


__all__ = ["CanvasOptions", "generate_canvas"]

"""The flags of ``dew generate MODEL`` and ``dew eval MODEL`` (the work is in
``dew.recipes.generate``).

Both read ``--prompts`` as ``dew.data.Prompts`` does (JSONL or verl parquet rows; token ids,
text or messages, the last two with a tokenizer). ``dew eval`` loads the reward and refuses
prompts lacking a field it ``needs`` before anything is generated. Errors are the ``dew``
command's one line (exit 2 for bad input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

GENERATE_EXAMPLE = (
    "example:\n  dew generate runs/sft --prompts prompts.jsonl --samples 4 --temperature 0.8 "
    "--out completions.jsonl\n"
    "  dew generate base/ --adapter runs/lora/adapter --prompts prompts.jsonl --merge-adapter"
)
EVAL_EXAMPLE = (
    "example:\n  dew eval runs/grpo --prompts test.jsonl --reward math --out eval.json\n"
    "  dew eval out/ --prompts test.jsonl --reward my_rewards:exact --reward-args "
    "'{\"strict\": true}'"
)


def _common(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("model", metavar="MODEL", help="a dew train run directory (its newest checkpoint) or "
        "an exported / Hugging Face model directory")  # fmt: skip
    add("--prompts", required=True, metavar="FILE",
        help="prompt rows: .jsonl or .parquet (verl layout), or a Hub dataset id")  # fmt: skip
    add("--tokenizer", default=None, metavar="DIR", help="tokenizer directory (default: the "
        "run's data.tokenizer, or the model directory's tokenizer files)")  # fmt: skip
    add("--max-prompt-len", type=int, default=1024, metavar="P", help="prompt width; a longer "
        "prompt is truncated from the left, keeping its last P ids (default 1024)")  # fmt: skip
    add("--max-new-tokens", type=int, default=256, help="completion budget (default 256)")
    add("--samples", type=int, default=1, metavar="N", help="completions per prompt (default 1)")
    add("--temperature", type=float, default=None,
        help="sampling temperature, 0 for greedy (default: 1 for generate, 0 for eval)")  # fmt: skip
    add("--top-k", type=int, default=None, help="sample from the k most likely ids")
    add("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    add("--eos-id", type=int, default=None, help="id that ends a completion (default: the "
        "tokenizer's eos_token)")  # fmt: skip
    add("--seed", type=int, default=0, help="sampling seed (default 0)")
    add("--batch", type=int, default=16, help="completions sampled at once (default 16)")
    add("--adapter", default=None, metavar="DIR", help="a PEFT LoRA adapter directory "
        "(adapter_config.json + adapter_model.safetensors, as dew train --lora-rank writes to "
        "RUN_DIR/adapter) for MODEL, the base; applied on the fly unless --merge-adapter")  # fmt: skip
    add("--merge-adapter", action="store_true", help="with --adapter: fold the adapter into "
        "the base weights once (faster decoding, same completions up to rounding)")  # fmt: skip
    add("--debug", action="store_true", help="show the traceback of an error")


def _command(commands: Any, name: str, help: str, description: str, epilog: str) -> Any:
    """One sub-command with the flags ``generate`` and ``eval`` share."""
    parser = commands.add_parser(name, help=help, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _common(parser)
    return parser


def add_commands(commands: Any) -> None:
    """Add ``generate MODEL`` and ``eval MODEL`` to ``dew``'s sub-command set."""
    generate = _command(
        commands,
        "generate",
        "sample completions of prompts from a run or model directory",
        "Sample completions of every prompt; one JSON line per completion (row, sample, ids, "
        "length, finish_reason, text when a tokenizer is known).",
        GENERATE_EXAMPLE,
    )
    generate.add_argument("--out", default=None, metavar="FILE.jsonl",
                          help="write the lines here, atomically (default: stdout)")  # fmt: skip
    _canvas_flags(generate)
    evaluate = _command(
        commands,
        "eval",
        "score completions of prompts with a reward",
        "Decode every prompt (greedy unless --temperature is given), score each completion "
        "with the reward and print the mean reward, its standard error and n.",
        EVAL_EXAMPLE,
    )
    evaluate.add_argument("--reward", required=True, metavar="SPEC",
                          help="math, or module:object (a class is made with --reward-args)")  # fmt: skip
    evaluate.add_argument("--reward-args", default=None, metavar="JSON",
                          help="keyword arguments of a reward class, a JSON object")  # fmt: skip
    evaluate.add_argument("--out", default=None, metavar="FILE.json",
                          help="write per-completion rewards and the summary here, atomically")  # fmt: skip


def _canvas_flags(parser: argparse.ArgumentParser) -> None:
    """``dew generate``'s canvas generation flags (masked-diffusion checkpoints)."""
    add = parser.add_argument
    add("--canvas-steps", type=int, default=None, metavar="N", help="fill a canvas of "
        "--max-new-tokens mask ids in N steps (a masked-diffusion checkpoint) instead of "
        "decoding left to right")  # fmt: skip
    add("--remasking", choices=("low_confidence", "ancestral"), default="low_confidence",
        help="with --canvas-steps: LLaDA's low-confidence remasking or MDLM's ancestral "
        "sampler (default low_confidence)")  # fmt: skip
    add("--block-length", type=int, default=None, metavar="L", help="with --canvas-steps: "
        "fill L positions at a time, left to right (default: all at once)")  # fmt: skip
    add("--block-causal", action="store_true", help="with --block-length: read the canvas "
        "block-causally (a block diffusion checkpoint)")  # fmt: skip
    add("--mask-id", type=int, default=None, help="with --canvas-steps: the mask id "
        "(default: the model's last id)")  # fmt: skip


def _sampling(args: argparse.Namespace, eos_id: int | None, default_temperature: float) -> Any:
    from dew.sampling import Sampling

    temperature = default_temperature if args.temperature is None else args.temperature
    eos = args.eos_id if args.eos_id is not None else eos_id
    return Sampling(temperature=temperature, top_k=args.top_k, top_p=args.top_p, eos_id=eos)


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from dew.data.prompts import Prompts
    from dew.recipes.generate import load_model
    from dew.recipes.references import local_path

    prompts_path = local_path(args.prompts, Path.cwd(), "--prompts")
    if args.max_prompt_len < 1:
        raise ValueError(f"--max-prompt-len: expected a positive int, got {args.max_prompt_len}")
    loaded = load_model(args.model, tokenizer=args.tokenizer)
    if args.merge_adapter and args.adapter is None:
        raise ValueError("--merge-adapter: expected --adapter DIR beside it, got no --adapter")
    if args.adapter is not None:
        from dew.recipes.generate_adapter import attach_adapter

        if getattr(args, "canvas_steps", None) is not None and not args.merge_adapter:
            raise ValueError(
                "--adapter: with --canvas-steps, expected --merge-adapter (canvas generation "
                "reads merged weights only), got an unmerged adapter"
            )
        loaded = attach_adapter(loaded, args.adapter, merge=args.merge_adapter)
    prompts = Prompts(prompts_path, tokenizer=loaded.tokenizer, max_prompt_len=args.max_prompt_len)
    return loaded, prompts


def _options(args: argparse.Namespace, loaded: Any, temperature: float) -> dict[str, Any]:
    return {"max_new_tokens": args.max_new_tokens, "samples": args.samples, "seed": args.seed,
            "batch": args.batch, "sampling": _sampling(args, loaded.eos_id, temperature)}  # fmt: skip


def run_generate(args: argparse.Namespace) -> int:
    """``dew generate``: sample (temperature 1 unless given) and write the JSON lines."""
    from dew.files import write_text
    from dew.recipes.generate import generate

    loaded, prompts = _load(args)
    if args.canvas_steps is not None:
        from dew.recipes.generate_canvas import CanvasOptions, generate_canvas

        options = CanvasOptions(args.canvas_steps, args.remasking, args.block_length,
                                args.block_causal, args.mask_id)  # fmt: skip
        records = generate_canvas(loaded, prompts, options, **_options(args, loaded, 1.0))
    else:
        records = generate(loaded, prompts, **_options(args, loaded, 1.0))
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_text(args.out, text)
    print(f"wrote {len(records)} completions of {len(prompts)} prompts from "
          f"{loaded.source} to {args.out}")  # fmt: skip
    return 0


def _reward(args: argparse.Namespace) -> Any:
    from dew.recipes.references import make_reward

    if os.getcwd() not in sys.path:  # --reward my_rewards:f finds ./my_rewards.py
        sys.path.insert(0, os.getcwd())
    reward_args = None
    if args.reward_args is not None:
        try:
            reward_args = json.loads(args.reward_args)
        except ValueError as err:
            raise ValueError(f"--reward-args: expected a JSON object ({err})") from None
    return make_reward(args.reward, "--reward", reward_args)


def run_eval(args: argparse.Namespace) -> int:
    """``dew eval``: check the reward and the prompts, decode (greedy unless a temperature
    is given), score, print the summary line and write ``--out``."""
    from dew.files import write_text
    from dew.recipes.generate import evaluate, reward_needs

    reward = _reward(args)
    loaded, prompts = _load(args)
    prompts.check_fields(reward_needs(args.reward), "--prompts", f"--reward {args.reward!r}")
    result = evaluate(loaded, prompts, reward, **_options(args, loaded, 0.0))
    summary = {k: result[k] for k in ("mean", "standard_error", "n")}
    if args.out is not None:
        write_text(args.out, json.dumps({**summary, "rows": result["rows"]}, ensure_ascii=False))
    print(f"eval: mean reward {summary['mean']:.6g} standard error "
          f"{summary['standard_error']:.6g} n {summary['n']} ({loaded.source})")  # fmt: skip
    return 0


__all__ = ["add_commands", "run_eval", "run_generate"]

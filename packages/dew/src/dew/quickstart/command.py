"""``dew quickstart``: post-train a small decoder end to end (SFT, DPO, GRPO) on arithmetic.

``main(argv)`` parses the options, builds the task, tokenizer and decoder, evaluates held-out
accuracy before and after each stage, and writes ``RUN_DIR/summary.json`` (atomically, at the
end) and ``RUN_DIR/plot.png``. A run directory that already holds a complete summary is only
reported; one that holds finished stages restores them and trains the rest. Returns the
process exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from dew.quickstart.config import SIZES, Settings

SUMMARY = "summary.json"


DESCRIPTION = (
    "Post-train a small decoder from scratch on generated arithmetic: SFT on worked answers, "
    "DPO on right/wrong pairs, GRPO with an exact-answer reward. Downloads nothing; held-out "
    "accuracy is measured by greedy decoding before and after each stage."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The quickstart's options, on a parser of its own or on a ``dew`` subcommand."""
    parser.add_argument(
        "--size", choices=SIZES, default="small", help="model and task preset (default small)"
    )
    parser.add_argument(
        "--steps",
        type=float,
        default=1.0,
        help="scale every stage's step count by this factor (default 1.0)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the problem split, init and sampling"
    )
    parser.add_argument(
        "--run-dir",
        default="dew-quickstart",
        help="where checkpoints, metrics, summary.json and plot.png go (default ./dew-quickstart)",
    )
    parser.add_argument(
        "--code",
        action="store_true",
        help="add a stage that writes Python programs, rewarded by running them in the "
        "dew-sandbox fleet (needs dew-sandbox installed)",
    )
    parser.add_argument(
        "--flow",
        action="store_true",
        help="instead of the language-model stages, train a small image DiT by flow matching "
        "and then Flow-GRPO, writing RUN_DIR/flow (needs dew-flow installed)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="train the stages after SFT (DPO, GRPO, code) as LoRA adapters (rank 8, every "
        "projection) on the model they start from, handing on the merged weights",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bars: on a terminal (auto), always or never",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew quickstart", description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_command(commands: Any) -> None:
    """Register ``quickstart`` on the ``dew`` command line's subparsers; dispatch the parsed
    arguments to :func:`run_command`."""
    parser = commands.add_parser(
        "quickstart", help="post-train a small model end to end", description=DESCRIPTION
    )
    add_arguments(parser)


def _check_settings(run_dir: str, settings: Settings) -> None:
    """Refuse to continue a run directory made with other settings."""
    from dew.quickstart.report import read_json, write_json

    path = os.path.join(run_dir, "config.json")
    wanted = settings.as_dict()
    if os.path.isfile(path):
        found = read_json(path)
        if found != wanted:
            changed = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
            raise SystemExit(
                f"dew quickstart: {run_dir} was started with other settings ({', '.join(changed)} "
                "differ); pass the same options or a new --run-dir"
            )
    else:
        write_json(path, wanted)


def build_context(settings: Settings, run_dir: str, progress: bool | None) -> Any:
    """The quickstart's shared state for ``settings``: its problems split into training and
    held-out, a tokenizer built on the training texts (saved under ``run_dir/tokenizer``) and a
    fresh decoder; returns ``(Context, held-out problems)``."""
    from dew.data.arithmetic import split
    from dew.data.chat.bpe import END, build_tokenizer, save_tokenizer, token_id, vocab_size
    from dew.quickstart.stages import Context
    from dew.recipes.builder import build_model

    problems = split(settings.limit, settings.held_out, settings.seed)
    texts = [p.worked() for p in problems.train]
    if settings.code:
        texts += [f"{p.code_question} {p.program()}" for p in problems.train[::4]]
    tokenizer = build_tokenizer(texts)
    save_tokenizer(tokenizer, os.path.join(run_dir, "tokenizer"))
    model, _ = build_model(
        settings.model_config(),
        vocab_size=vocab_size(tokenizer),
        max_seq_len=settings.sft_seq_len + 1,
    )
    ctx = Context(
        settings=settings,
        run_dir=run_dir,
        model=model,
        tokenizer=tokenizer,
        end_id=token_id(tokenizer, END),
        train=problems.train,
        progress=progress,
    )
    return ctx, problems.held_out


def run(settings: Settings, run_dir: str, progress: bool | None = None) -> dict[str, Any]:
    """Train (or restore) every stage and return the summary written to ``summary.json``."""
    from dew.quickstart.stages import stages
    from dew.rewards.accuracy import Evaluator

    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    _check_settings(run_dir, settings)
    with contextlib.ExitStack() as stack:
        ctx, held_out = build_context(settings, run_dir, progress)
        evaluators = {"": Evaluator(ctx.model, ctx.tokenizer, held_out, ctx.end_id,
                                    settings.max_new_tokens)}  # fmt: skip
        if settings.code:
            ctx, evaluators["code"] = _code_setup(stack, ctx, held_out)
        return _run_stages(settings, run_dir, ctx, evaluators, stages(settings), t0)


def _code_setup(stack: contextlib.ExitStack, ctx: Any, held_out: Any) -> tuple[Any, Any]:
    """Open the sandbox fleet for ``--code``: the stage's reward and its held-out evaluator."""
    import dataclasses

    from dew.quickstart.plugins import load_code_reward
    from dew.quickstart.stages import DATA_SOURCE, code_new_tokens
    from dew.rewards.accuracy import Evaluator

    reward = stack.enter_context(load_code_reward()())
    ctx = dataclasses.replace(ctx, code_reward=reward)
    settings = ctx.settings
    evaluator = Evaluator(
        ctx.model,
        ctx.tokenizer,
        held_out[: settings.code_held_out],
        ctx.end_id,
        code_new_tokens(settings),
        question=lambda p: p.code_question,
        score=lambda p, text: reward(DATA_SOURCE, text, p.code_tests(), "") > 0,
    )
    return ctx, evaluator


def _run_stages(
    settings: Settings, run_dir: str, ctx: Any, evaluators: Any, stages: Any, t0: float
) -> dict[str, Any]:
    import jax

    from dew.quickstart.machine import machine_record
    from dew.quickstart.report import (
        read_json,
        report,
        reward_curve,
        write_json,
        write_report_plot,
    )
    from dew.rewards.accuracy import changed

    params: Any = initial_params(ctx)
    before: Any = None
    measured_by: Any = None
    results = []
    for name, train in stages:
        evaluate = evaluators.get(name, evaluators[""])
        result_path = os.path.join(run_dir, name, "result.json")
        steps = getattr(settings, f"{name}_steps")
        if os.path.isfile(result_path):
            print(f"[{name}] finished earlier: restoring its final checkpoint", flush=True)
            state, _ = train(ctx, params)
            params = jax.device_get(state.params)
            results.append(read_json(result_path))
            before = None
            continue
        if before is None or measured_by is not evaluate:
            before = evaluate(params)
            measured_by = evaluate
        start = time.perf_counter()
        print(f"[{name}] training {steps} steps", flush=True)
        state, extra = train(ctx, params)
        seconds = time.perf_counter() - start
        params = jax.device_get(state.params)
        after = evaluate(params)
        result = {
            "name": name,
            "steps": steps,
            "accuracy_before": before.accuracy,
            "accuracy_after": after.accuracy,
            "standard_error_before": round(before.standard_error, 4),
            "standard_error_after": round(after.standard_error, 4),
            "seconds": round(seconds, 2),
            "solved_before": before.solved,
            "solved_after": after.solved,
            "held_out": after.total,
            **extra,
            "examples_after": [
                {"question": q, "response": r, "correct": ok}
                for q, r, ok in list(zip(after.questions, after.responses, after.correct))[:4]
            ],
            "changed": changed(before, after),
            "final_metrics": _last_metrics(run_dir, name),
        }
        write_json(result_path, result)
        print(
            f"[{name}] held-out accuracy {before.accuracy:.3f} -> {after.accuracy:.3f} "
            f"({seconds:.1f} s)",
            flush=True,
        )
        results.append(result)
        before = after
    plot = write_report_plot(run_dir, results)
    curves = {r["name"]: reward_curve(run_dir, r["name"]) for r in results}
    curves = {name: curve for name, curve in curves.items() if curve}
    summary: dict[str, Any] = {
        "complete": True,
        "settings": settings.as_dict(),
        "machine": machine_record(),
        "stages": results,
        "reward_curves": curves,
        "seconds": round(time.perf_counter() - t0, 2),
        "plot": os.path.basename(plot),
    }
    write_json(os.path.join(run_dir, SUMMARY), summary)
    print(report(results, curves), flush=True)
    print(f"summary: {os.path.join(run_dir, SUMMARY)}  plot: {plot}", flush=True)
    return summary


def initial_params(ctx: Any) -> Any:
    """The random initialisation SFT starts from (deterministic in the seed)."""
    import jax
    import jax.numpy as jnp

    dummy = jnp.zeros((1, ctx.settings.sft_seq_len), jnp.int32)
    key = jax.random.fold_in(jax.random.key(ctx.settings.seed), 0)
    return jax.device_get(ctx.model.init(key, dummy))


def _last_metrics(run_dir: str, name: str) -> dict[str, Any]:
    from dew.quickstart.report import read_metrics

    records = read_metrics(os.path.join(run_dir, name, "metrics.jsonl"))
    return records[-1] if records else {}


def run_command(args: argparse.Namespace) -> int:
    """Run the quickstart for parsed options; returns the exit status."""
    from dew.quickstart.report import read_json, report

    run_dir = os.path.abspath(args.run_dir)
    progress = {"auto": None, "on": True, "off": False}[args.progress]
    if getattr(args, "flow", False):
        from dew.quickstart.plugins import load_flow

        return int(load_flow()(os.path.join(run_dir, "flow"), args.seed, args.steps, progress))
    settings = Settings.for_size(
        args.size, steps=args.steps, seed=args.seed, code=args.code, lora=args.lora
    )
    summary_path = os.path.join(run_dir, SUMMARY)
    if os.path.isfile(summary_path):
        summary = read_json(summary_path)
        if summary.get("complete") and summary.get("settings") == settings.as_dict():
            print(f"dew quickstart: {run_dir} is complete; nothing to train.")
            print(report(summary["stages"], summary.get("reward_curves")))
            return 0
    run(settings, run_dir, progress)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dew quickstart``; returns the exit status."""
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

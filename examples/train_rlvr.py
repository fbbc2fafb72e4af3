"""Asynchronous RLVR: GRPO from the quickstart's SFT model, one batch drawn ahead of the trainer.

The quickstart's arithmetic task (``dew quickstart``) gives the policy: its SFT stage trains a
small decoder to answer ``"37+48"`` with worked columns and a ``\\boxed{}`` result and, with
code questions mixed in, ``"python 37+48"`` with a fenced program. This example starts from
that SFT checkpoint (trained here, or restored when ``--run-dir`` already holds it) and runs
GRPO where

- a ``NativeRolloutServer`` draws completions on a background thread;
- a ``PromptSource`` scores each completion as its draw finishes: arithmetic answers by
  ``MathReward`` (the exact boxed value), programs by ``CodeReward`` running them on a
  ``SandboxFleet`` of ``ProcessRunner`` processes;
- a ``RolloutScheduler`` submits batch ``i + 1`` before the trainer updates on batch ``i``
  (``ahead=1``), so drawing and verifying overlap the update; the lag that allows is corrected
  by a TIS cap (``behavior_importance``), and truncated answers are still scored
  (``truncation="score"``).

Held-out accuracy (greedy decoding; arithmetic by ``MathReward``, code by ``CodeReward``) is
printed before and after GRPO, with the scheduler's lag and the seconds the trainer waited.

With ``--engine vllm`` the completions come from a running vLLM server instead
(``OpenAIRolloutServer``, token ids in and out) and every weight push goes through
``Publication(SafetensorsReload(...))``: the policy is written in bfloat16 to the checkpoint
directory the server was launched on (``--vllm-dir``), and the server pauses (running draws
finish), reloads it, resets its prefix cache and resumes. The engine can only reload weights
of the shape it was launched with, so the policy takes its decoder from that directory's
``config.json`` (its vocabulary must hold the quickstart tokenizer's, vLLM's CPU attention
takes head sizes 32, 64, 80, ... 512, not 16, and its embeddings untied) and SFT starts from
a fresh initialisation of it. The server must run with ``--skip-tokenizer-init`` (prompts
are ids), ``--logprobs-mode processed_logprobs`` (the rollouts sample at a temperature below
one) and ``VLLM_SERVER_DEV_MODE=1`` (the reload routes). The SFT policy is pushed as version
0 before GRPO and the final policy after it, so the server ends serving what was trained.

Run::

    JAX_PLATFORMS=cpu uv run python examples/train_rlvr.py --run-dir runs/rlvr [--size small]
    JAX_PLATFORMS=cpu uv run python examples/train_rlvr.py --engine vllm \\
        --vllm-url http://127.0.0.1:8000 --vllm-dir /ckpt/policy --run-dir runs/rlvr-vllm
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import threading
import time
import warnings
from typing import Any

import httpx
import jax
import optax

from dew import Trainer
from dew.data.prompts import Prompts
from dew.inference import Server
from dew.models import Pretrained, load_pretrained
from dew.objectives.rl import GRPOObjective
from dew.quickstart.command import build_context, initial_params
from dew.quickstart.config import Settings
from dew.quickstart.evaluate import Evaluator, prompt_ids
from dew.quickstart.stages import LOADING, code_new_tokens, run_sft
from dew.quickstart.tokenizer import vocab_size
from dew.rewards import MathReward
from dew.rollout import (
    NativeRolloutServer,
    OpenAICompletion,
    OpenAIRolloutServer,
    PromptSource,
    Publication,
    RolloutScheduler,
    SafetensorsReload,
    prompt_tasks,
)
from dew.rollout.remote import RemoteServer
from dew.sampling import Sampling
from dew.sandbox import CodeReward, ProcessRunner, SandboxFleet, SandboxLimits

MATH, CODE = "arithmetic", "python"


class Verifier:
    """``reward(data_source, completion, ground_truth, extra_info)`` by the task's kind:
    ``MathReward`` for arithmetic, ``CodeReward`` (programs run on the fleet) for code."""

    def __init__(self, fleet: SandboxFleet) -> None:
        self.math = MathReward()
        self.code = CodeReward(fleet)
        self.scored = {MATH: 0, CODE: 0}
        self.lock = threading.Lock()

    def __call__(self, data_source: str, completion: str, truth: str, info: str) -> float:
        judge = self.code if data_source == CODE else self.math
        value = float(judge(data_source, completion, truth, info))
        with self.lock:
            self.scored[CODE if data_source == CODE else MATH] += 1
        return value


def rlvr_prompts(ctx: Any, seed: int) -> tuple[Prompts, int]:
    """Every training question twice: as arithmetic (truth: the answer) and as code (truth:
    its test case); returns the prompts and their width P."""
    records, longest = [], 0
    for problem in ctx.train:
        for kind, question, truth in ((MATH, problem.question, str(problem.answer)),
                                      (CODE, problem.code_question, problem.code_tests())):  # fmt: skip
            records.append(json.dumps({"prompt": [{"role": "user", "content": question}],
                                       "data_source": kind, "ground_truth": truth}))  # fmt: skip
            longest = max(longest, len(prompt_ids(ctx.tokenizer, question)))
    prompts = Prompts(records=tuple(records), tokenizer=ctx.tokenizer, max_prompt_len=longest,
                      loading=LOADING, seed=seed)  # fmt: skip
    return prompts, longest


def serve(ctx: Any, params: Any, sampling: Sampling, slots: int) -> NativeRolloutServer:
    """The rollout server: Dew's continuous-batching server on a background thread."""
    core = Server(ctx.model, params, slots=slots, capacity=ctx.model.config.max_seq_len,
                  sampling=sampling)  # fmt: skip
    return NativeRolloutServer(core)


def served_policy(directory: str, tokens: int) -> Pretrained:
    """The decoder a vLLM server launched on ``directory`` serves, checked against the
    quickstart tokenizer's ``tokens`` ids (the weights are replaced by training)."""
    served = load_pretrained(directory)
    if served.config.vocab_size < tokens:
        raise ValueError(
            f"--vllm-dir: the served model's vocabulary ({served.config.vocab_size}) is smaller "
            f"than the quickstart tokenizer's ({tokens})"
        )
    return served


def vllm_server(url: str, directory: str, policy: Pretrained, sampling: Sampling,
                sft: Any, concurrency: int, stack: contextlib.ExitStack) -> RemoteServer:  # fmt: skip
    """Draws from the vLLM server at ``url``, pushes through ``SafetensorsReload`` into
    ``directory``; the SFT weights are published as version 0 before the first draw."""
    client = stack.enter_context(httpx.Client(base_url=url, timeout=300))
    listed = client.get("/v1/models")
    listed.raise_for_status()
    names = [entry["id"] for entry in listed.json()["data"]]
    if len(names) != 1:
        raise ValueError(f"--vllm-url: expected a server with one model, it lists {names}")
    reload = SafetensorsReload(policy, directory, [url], "vllm", client=client)
    publication = Publication(reload, version=0)
    publication.load(sft, 0)
    completion = OpenAICompletion(names[0], client, provider="vllm")
    return OpenAIRolloutServer(completion, sampling, publication, processed_logprobs=True,
                               concurrency=concurrency)  # fmt: skip


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", default="runs/rlvr")
    p.add_argument("--size", default="small", choices=("tiny", "small", "medium"))
    p.add_argument("--sft-scale", type=float, default=1.0, help="scale of the SFT steps")
    p.add_argument("--steps", type=int, default=60, help="GRPO updates")
    p.add_argument("--prompts", type=int, default=16, help="tasks per update")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.3)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--ahead", type=int, default=1)
    p.add_argument("--held-out", type=int, default=64, help="held-out questions of each kind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="sandbox processes")
    p.add_argument("--engine", default="native", choices=("native", "vllm"),
                   help="draw with Dew's own server or a running vLLM server")  # fmt: skip
    p.add_argument("--vllm-url", help="root URL of the vLLM server (--engine vllm)")
    p.add_argument("--vllm-dir", help="the checkpoint directory that server was launched on; "
                   "the policy takes its shape and each push rewrites it")  # fmt: skip
    args = p.parse_args(argv)
    if args.engine == "vllm" and not (args.vllm_url and args.vllm_dir):
        p.error("--engine vllm needs --vllm-url and --vllm-dir")
    return args


def main(argv: list[str] | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the example from command-line arguments; returns its summary."""
    return train(arguments(argv), quiet)[0]


def train(args: argparse.Namespace, quiet: bool = False) -> tuple[dict[str, Any], Any]:
    """SFT (or restore it), then GRPO one batch ahead; returns the summary and the final
    variables."""
    settings = Settings.for_size(args.size, steps=args.sft_scale, seed=args.seed, code=True)
    os.makedirs(args.run_dir, exist_ok=True)
    ctx, held_out = build_context(settings, args.run_dir, progress=False if quiet else None)
    policy = None
    if args.engine == "vllm":
        policy = served_policy(args.vllm_dir, vocab_size(ctx.tokenizer))
        ctx = dataclasses.replace(ctx, model=policy.model)
    state, _ = run_sft(ctx, initial_params(ctx))  # restored when RUN_DIR/sft finished
    sft = jax.device_get(state.params)

    prompts, width_p = rlvr_prompts(ctx, args.seed)
    budget = code_new_tokens(settings)
    width = min(width_p + budget, ctx.model.config.max_seq_len)
    budget = width - width_p
    sampling = Sampling(temperature=args.temperature, eos_id=ctx.end_id)
    limits = SandboxLimits(cpu_seconds=1.0, deadline_seconds=5.0)
    # ProcessRunner forks from a process where JAX runs threads; a child stuck before exec is
    # killed at its deadline and scores 0 (as in the quickstart's --code stage), so Python's
    # warning about that fork is not printed once per sampled program.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    records: list[Any] = []
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(SandboxFleet(ProcessRunner(), limits=limits,
                                                 workers=args.workers))  # fmt: skip
        verifier = Verifier(fleet)
        problems = held_out[: args.held_out]
        evaluators = {
            MATH: Evaluator(ctx.model, ctx.tokenizer, problems, ctx.end_id, settings.max_new_tokens),
            CODE: Evaluator(ctx.model, ctx.tokenizer, problems, ctx.end_id, budget,
                            question=lambda q: q.code_question,
                            score=lambda q, text: verifier(CODE, text, q.code_tests(), "") > 0),
        }  # fmt: skip
        before = {kind: evaluate(sft).accuracy for kind, evaluate in evaluators.items()}
        verifier.scored = {MATH: 0, CODE: 0}  # count the training rollouts only

        objective = GRPOObjective(ctx.model, seq_len=width - 1, pretrained=sft,
                                  behavior_importance=2.0,
                                  sampling_temperature=args.temperature)  # fmt: skip
        server: NativeRolloutServer | RemoteServer
        if policy is None:
            server = serve(ctx, sft, sampling, args.prompts * args.groups)
        else:
            server = vllm_server(args.vllm_url, args.vllm_dir, policy, sampling, sft,
                                 args.prompts * args.groups, stack)  # fmt: skip
        stack.callback(server.close)
        source = PromptSource(server, verifier, max_new_tokens=budget,
                              decode=ctx.tokenizer.decode, workers=args.workers)  # fmt: skip
        stack.callback(source.close)
        scheduler = RolloutScheduler(
            objective, source, server, width=width, rows=args.prompts * args.groups,
            tasks=prompt_tasks, groups=args.groups, ahead=args.ahead, max_lag=max(args.ahead, 1),
            truncation="score", eos_ids=(ctx.end_id,), seed=args.seed, log=records.append,
        )  # fmt: skip
        stack.callback(scheduler.close)
        trainer = Trainer(objective, optax.adam(args.learning_rate),
                          key=jax.random.key(args.seed), rollout=scheduler,
                          progress=False if quiet else None)  # fmt: skip
        start = time.perf_counter()
        final = trainer.fit(scheduler.tasks(prompts.load(args.prompts)), steps=args.steps,
                            run_dir=os.path.join(args.run_dir, "rlvr"), log_every=5)  # fmt: skip
        seconds = time.perf_counter() - start
        scheduler.close()  # the batch submitted ahead of a step that will not come
        scored = dict(verifier.scored)
        params = jax.device_get(final.params)
        if policy is not None:  # the engine ends serving the trained policy
            server.load(params, server.version + 1)
        served = server.version
        after = {kind: evaluate(params).accuracy for kind, evaluate in evaluators.items()}
    rewards = [r.metrics.get("reward/mean", 0.0) for r in records]
    summary = {
        "accuracy_before": before,
        "accuracy_after": after,
        "held_out": len(problems),
        "steps": args.steps,
        "seconds": round(seconds, 2),
        "waited": round(sum(r.waited for r in records[1:]), 3),
        "lags": [r.lag for r in records],
        "updates": [r.updates for r in records],
        "versions": [r.version for r in records],
        "pushed": [r.pushed for r in records],
        "served_version": served,
        "engine": args.engine,
        "scored": scored,
        "admitted_groups": [r.admitted_groups for r in records],
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
    }
    if not quiet:
        for kind in (MATH, CODE):
            print(f"held-out {kind} accuracy {before[kind]:.3f} -> {after[kind]:.3f}")
        print(json.dumps(summary))
    return summary, params


if __name__ == "__main__":
    main()

"""Asynchronous RLVR: GRPO from an SFT model, one batch drawn ahead of the trainer.

The quickstart's arithmetic task (``dew.data.arithmetic``, the task of ``dew quickstart``)
gives the policy: an SFT stage, built as the quickstart builds its own (the same tokenizer,
decoder, careless-tutor demonstrations, optimizer and seeds, through the public
``dew.recipes`` chain), trains a small decoder to answer ``"37+48"`` with worked columns and
a ``\\boxed{}`` result and ``"python 37+48"`` with a fenced program. This example starts
from that SFT checkpoint (trained here, or restored when ``--run-dir`` already holds it) and
runs GRPO where

- a ``NativeRolloutServer`` draws completions on a background thread;
- a ``PromptSource`` scores each completion as its draw finishes: arithmetic answers by
  ``MathReward`` (the exact boxed value), programs by ``CodeReward`` running them on a
  ``SandboxFleet`` of ``ProcessRunner`` processes;
- a ``RolloutScheduler`` submits batch ``i + 1`` before the trainer updates on batch ``i``
  (``ahead=1``), so drawing and verifying overlap the update; the lag that allows is corrected
  by a TIS cap (``behavior_importance``), and truncated answers are still scored
  (``truncation="score"``).

Held-out accuracy (``dew.rewards.Evaluator``: greedy decoding; arithmetic by ``MathReward``,
code by ``CodeReward``) is printed before and after GRPO, with the scheduler's lag and the seconds the trainer waited.

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
import json
import os
import threading
import time
import warnings
from typing import Any, NamedTuple

import httpx
import jax
import jax.numpy as jnp
import optax

from dew import Trainer
from dew.data import Loading
from dew.data.arithmetic import Problem, careless, split
from dew.data.chat import (
    ChatMessages,
    build_tokenizer,
    prompt_ids,
    save_tokenizer,
    token_id,
    vocab_size,
)
from dew.data.prompts import Prompts
from dew.files import atomic_write
from dew.inference import Server
from dew.models import Pretrained, load_pretrained
from dew.objectives.rl import GRPOObjective
from dew.recipes import (
    ModelConfig,
    OptimizerConfig,
    Recipe,
    ScheduleConfig,
    Stage,
    build_model,
    build_optimizer,
)
from dew.rewards import Evaluator, MathReward
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
LOADING = Loading(workers=0, threads=1, read_buffer=2)
#: The quickstart's presets (``dew quickstart --size``): operands below ``limit``, held-out
#: problems, the decoder's shape, SFT steps and rows per step.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(limit=20, held_out=32, emb_features=32, num_layers=1, num_heads=2,
                 mlp_features=64, sft_steps=40, batch=8, log_every=2, checkpoint_every=2),
    "small": dict(limit=100, held_out=1000, emb_features=64, num_layers=2, num_heads=4,
                  mlp_features=256, sft_steps=600, batch=32, log_every=5, checkpoint_every=50),
    "medium": dict(limit=100, held_out=1000, emb_features=64, num_layers=2, num_heads=4,
                   mlp_features=256, sft_steps=900, batch=32, log_every=5, checkpoint_every=50),
}  # fmt: skip
SFT_SEQ_LEN, SFT_LR, SLIP_RATE = 63, 3e-3, 0.7
ANSWER_TOKENS = 24  # the response budget of arithmetic answers
CODE_TOKENS = ANSWER_TOKENS + 16  # the fence and print(...) need more ids


class Task(NamedTuple):
    """The SFT side of the example: problems, tokenizer and decoder.

    ``train`` and ``held_out`` are disjoint (``dew.data.arithmetic.split``); ``end_id`` is
    ``<|end|>``, the id every message ends with; ``model`` reads rows of at most
    ``SFT_SEQ_LEN + 1`` ids (or the served decoder's width with ``--engine vllm``).
    """

    train: tuple[Problem, ...]
    held_out: tuple[Problem, ...]
    tokenizer: Any
    end_id: int
    model: Any


def build_task(size: dict[str, int], seed: int, run_dir: str) -> Task:
    """The quickstart's task with code questions: its problems, a tokenizer trained on the
    worked answers and a quarter of the programs (saved under ``run_dir/tokenizer``), and a
    fresh decoder of the preset's shape."""
    problems = split(size["limit"], size["held_out"], seed)
    texts = [p.worked() for p in problems.train]
    texts += [f"{p.code_question} {p.program()}" for p in problems.train[::4]]
    tokenizer = build_tokenizer(texts)
    save_tokenizer(tokenizer, os.path.join(run_dir, "tokenizer"))
    shape = {k: size[k] for k in ("emb_features", "num_layers", "num_heads", "mlp_features")}
    model, _ = build_model(ModelConfig(name="causal_transformer", **shape),
                           vocab_size=vocab_size(tokenizer), max_seq_len=SFT_SEQ_LEN + 1)  # fmt: skip
    end_id = token_id(tokenizer, tokenizer.special["eos_token"])
    return Task(problems.train, problems.held_out, tokenizer, end_id, model)


def run_sft(task: Task, size: dict[str, int], scale: float, seed: int, run_dir: str,
            progress: bool | None) -> Any:  # fmt: skip
    """SFT in ``run_dir/sft`` as ``dew quickstart`` trains it (restored when it finished):
    the careless tutor's worked answers (``dew.data.arithmetic.careless``) and every fourth
    problem as a program, AdamW warming up over a fifteenth of the steps, then a cosine to a
    tenth of the rate. Returns the host variables."""
    steps = max(2, int(round(size["sft_steps"] * scale)))
    slips = careless(task.train, SLIP_RATE, seed)
    chats = [(p.question, (p.careless() if slip else None) or p.worked())
             for p, slip in zip(task.train, slips, strict=True)]  # fmt: skip
    chats += [(p.code_question, p.program()) for p in task.train[::4]]
    path = os.path.join(run_dir, "data", "sft.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_write(path, "w") as f:
        for question, answer in chats:
            messages = [{"role": "user", "content": question},
                        {"role": "assistant", "content": answer}]  # fmt: skip
            f.write(json.dumps({"messages": messages}) + "\n")
    data = ChatMessages(path, task.tokenizer, seq_len=SFT_SEQ_LEN, seed=seed, loading=LOADING)
    optimizer = build_optimizer(
        OptimizerConfig(name="adamw", learning_rate=SFT_LR, weight_decay=0.01, clip=0.0),
        ScheduleConfig(kind="cosine", warmup_steps=max(1, steps // 15), end_fraction=0.1),
        steps=steps,
    )
    key = jax.random.fold_in(jax.random.key(seed), 0)
    start = task.model.init(key, jnp.zeros((1, SFT_SEQ_LEN), jnp.int32))
    recipe = Recipe(model=task.model, optimizer=optimizer, key=key, output=run_dir,
                    batch=size["batch"], stages=(Stage("sft", data, steps=steps),),
                    pretrained=jax.device_get(start), log_every=size["log_every"],
                    progress=progress, checkpoint_every=size["checkpoint_every"])  # fmt: skip
    (state,) = recipe.run()
    return jax.device_get(state.params)


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


def rlvr_prompts(ctx: Task, seed: int) -> tuple[Prompts, int]:
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


def serve(ctx: Task, params: Any, sampling: Sampling, slots: int) -> NativeRolloutServer:
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
    size = SIZES[args.size]
    os.makedirs(args.run_dir, exist_ok=True)
    ctx = build_task(size, args.seed, args.run_dir)
    held_out = ctx.held_out
    policy = None
    if args.engine == "vllm":
        policy = served_policy(args.vllm_dir, vocab_size(ctx.tokenizer))
        ctx = ctx._replace(model=policy.model)
    # restored when RUN_DIR/sft finished
    sft = run_sft(ctx, size, args.sft_scale, args.seed, args.run_dir, False if quiet else None)

    prompts, width_p = rlvr_prompts(ctx, args.seed)
    budget = CODE_TOKENS
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
            MATH: Evaluator(ctx.model, ctx.tokenizer, problems, ctx.end_id, ANSWER_TOKENS),
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

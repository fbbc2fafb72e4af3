"""The quickstart's three stages: SFT and DPO through ``dew.recipes.chain``, then GRPO.

* SFT: ``ChatMessages`` over the training problems' worked answers (loss on the assistant
  tokens), one single-stage ``Recipe`` so it gets its own optimizer (AdamW with warm-up and
  cosine decay) and batch.
* DPO: ``PreferencePairs`` of the right worked answer against the SFT policy's own wrong
  greedy answer to the same training question (see ``dpo_data``), again a single-stage
  ``Recipe``; the SFT policy is the frozen reference.
* GRPO: ``Prompts`` of the training questions, ``SampledRollout`` sampling ``groups``
  answers per prompt at ``grpo_temperature`` until ``<|end|>``, decoded by the tokenizer and
  scored by ``MathReward``; the objective scores at the same temperature. It runs on
  ``Trainer`` directly rather than through the chain,
  because the chain's GRPO stage keeps ``SampledRollout``'s defaults (token ids as reward
  text, no end-of-sequence id, temperature 1), which ``MathReward`` cannot read.

* code (``--code`` only): the same GRPO on ``"python a+b"`` questions, rewarded by the
  sandbox's ``CodeReward`` running each completion's program on a ``ProcessRunner`` fleet
  (found through ``dew.quickstart.plugins``, since ``dew`` does not import ``dew.sandbox``).
  SFT then also teaches the program format on a quarter of the training problems.

Every stage trains in ``RUN_DIR/<stage>`` (checkpoints and ``metrics.jsonl``), so a stage
that already finished restores its final checkpoint instead of training again, and an
interrupted one resumes from its newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
import optax

from dew.data import Loading
from dew.data.chat import ChatMessages
from dew.data.chat.template import ChatTokenizer
from dew.data.preference import PreferencePairs
from dew.data.prompts import Prompts
from dew.files import atomic_write
from dew.inference import TextGeneration
from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rollouts.sampled import SampledRollout
from dew.quickstart.config import Settings
from dew.quickstart.evaluate import prompt_ids
from dew.quickstart.task import Problem
from dew.quickstart.tokenizer import END
from dew.recipes.chain import Recipe, Stage
from dew.rewards import MathReward
from dew.sampling import Sampling
from dew.trainer import Trainer, TrainState

DATA_SOURCE = "dew-quickstart-arithmetic"
LOADING = Loading(workers=0, threads=1, read_buffer=2)


@dataclasses.dataclass(frozen=True)
class Context:
    """What every stage shares: settings, run directory, model, tokenizer and problems."""

    settings: Settings
    run_dir: str
    model: Any
    tokenizer: ChatTokenizer
    end_id: int
    train: tuple[Problem, ...]
    progress: bool | None = None
    code_reward: Any = None


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    with atomic_write(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _conversation(problem: Problem) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": problem.question},
            {"role": "assistant", "content": problem.worked()},
        ]
    }


def _code_conversation(problem: Problem) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": problem.code_question},
            {"role": "assistant", "content": problem.program()},
        ]
    }


def code_new_tokens(settings: Settings) -> int:
    """The response budget of code answers: the fence and ``print(...)`` need more ids."""
    return settings.max_new_tokens + 16


def sft_data(ctx: Context) -> ChatMessages:
    """The worked answers of the training problems, written to ``RUN_DIR/data/sft.jsonl``.

    With ``--code`` every fourth training problem also appears as a code question.
    """
    folder = os.path.join(ctx.run_dir, "data")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "sft.jsonl")
    rows = [_conversation(p) for p in ctx.train]
    if ctx.settings.code:
        rows += [_code_conversation(p) for p in ctx.train[::4]]
    _write_jsonl(path, rows)
    s = ctx.settings
    return ChatMessages(path, ctx.tokenizer, seq_len=s.sft_seq_len, seed=s.seed, loading=LOADING)


def response_ids(ctx: Context, text: str) -> list[int]:
    """The ids of an assistant answer followed by ``<|end|>`` (what the model must write)."""
    return ctx.tokenizer.encode(text + END)


def first_difference(chosen: list[int], rejected: list[int]) -> int:
    """Index into ``rejected`` of its first id that departs from ``chosen``.

    When ``rejected`` is a strict prefix of ``chosen`` its last id is returned (that is where
    it stops early); identical responses are refused.
    """
    for index, (a, b) in enumerate(zip(chosen, rejected)):
        if a != b:
            return index
    if len(chosen) == len(rejected):
        raise ValueError("rejected: the wrong answer equals the right one")
    return min(len(chosen), len(rejected) - 1)


def dpo_data(ctx: Context, start: Any) -> PreferencePairs:
    """Pairs of the right worked answer against the policy's own wrong one.

    The starting policy answers ``dpo_problems`` training questions greedily; each wrong
    answer becomes the rejected side of a pair whose chosen side is the worked answer (when
    fewer than ``dpo_batch`` answers are wrong, slipped answers from ``Problem.wrong`` fill
    in). The rejected side is scored up to and including its first wrong id: what follows a
    slip is a consistent continuation of a wrong intermediate result, and pushing it down
    would teach the model to stop writing well-formed steps. The shared prefix cancels
    between the two sides, so the preference falls on the slip against the right id and the
    rest of the right answer.
    """
    s = ctx.settings
    rng = np.random.default_rng([s.seed, 1])
    picked = [ctx.train[i] for i in rng.permutation(len(ctx.train))[: s.dpo_problems]]
    generation = TextGeneration(ctx.model).bind(start)
    contexts = [prompt_ids(ctx.tokenizer, p.question) for p in picked]
    sampling = Sampling(temperature=0.0, eos_id=ctx.end_id)
    drawn = generation(contexts, s.max_new_tokens, jax.random.key(s.seed), sampling)
    assert isinstance(drawn, list)
    reward = MathReward()
    pairs: list[tuple[list[int], list[int], list[int]]] = []
    for problem, prompt, draw in zip(picked, contexts, drawn, strict=True):
        ids = [int(i) for i in draw.ids]
        text = ctx.tokenizer.decode([i for i in ids if i != ctx.end_id])
        if reward(DATA_SOURCE, text, str(problem.answer), "") == 0.0:
            pairs.append((prompt, response_ids(ctx, problem.worked()), ids))
    for problem in picked:
        if len(pairs) >= s.dpo_batch:
            break
        prompt = prompt_ids(ctx.tokenizer, problem.question)
        wrong = response_ids(ctx, problem.wrong(rng))
        pairs.append((prompt, response_ids(ctx, problem.worked()), wrong))
    records = []
    width = 0
    for prompt, chosen, rejected in pairs:
        width = max(width, len(prompt) + len(chosen), len(prompt) + len(rejected))
        slip = first_difference(chosen, rejected)
        records.append(
            json.dumps(
                {
                    "chosen": prompt + chosen,
                    "rejected": prompt + rejected,
                    "chosen_mask": [0] * len(prompt) + [1] * len(chosen),
                    "rejected_mask": [0] * len(prompt)
                    + [1] * (slip + 1)
                    + [0] * (len(rejected) - slip - 1),
                }
            )
        )
    pad = ctx.tokenizer.pad_id or 0
    return PreferencePairs(
        records=tuple(records), seq_len=width, pad_id=pad, loading=LOADING, seed=s.seed
    )


def prompt_data(ctx: Context, code: bool = False) -> Prompts:
    """The training questions as GRPO prompts, with the exact answer as ground truth.

    With ``code`` the questions ask for a program and the ground truth is its test case.
    """
    records = tuple(
        json.dumps(
            {
                "prompt": [{"role": "user", "content": p.code_question if code else p.question}],
                "data_source": DATA_SOURCE,
                "ground_truth": p.code_tests() if code else str(p.answer),
            }
        )
        for p in ctx.train
    )
    longest = max(
        len(prompt_ids(ctx.tokenizer, p.code_question if code else p.question)) for p in ctx.train
    )
    return Prompts(
        records=records,
        tokenizer=ctx.tokenizer,
        max_prompt_len=longest,
        loading=LOADING,
        seed=ctx.settings.seed,
    )


def _recipe(
    ctx: Context, stage: Stage, optimizer: Any, batch: int, start: Any, index: int
) -> TrainState:
    """Run one chain stage in ``RUN_DIR/<stage.name>`` and return its final state."""
    options: dict[str, Any] = {}
    if "progress" in {f.name for f in dataclasses.fields(Recipe)}:
        options["progress"] = ctx.progress
    recipe = Recipe(
        model=ctx.model,
        optimizer=optimizer,
        key=jax.random.fold_in(jax.random.key(ctx.settings.seed), index),
        output=ctx.run_dir,
        batch=batch,
        stages=(stage,),
        pretrained=start,
        log_every=ctx.settings.log_every,
        **options,
    )
    (state,) = recipe.run()
    return state


def run_sft(ctx: Context, start: Any) -> TrainState:
    s = ctx.settings
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, s.sft_lr, max(1, s.sft_steps // 15), s.sft_steps, s.sft_lr * 0.1
    )
    optimizer = optax.adamw(schedule, weight_decay=0.01)
    stage = Stage("sft", sft_data(ctx), steps=s.sft_steps)
    return _recipe(ctx, stage, optimizer, s.sft_batch, start, 0)


def run_dpo(ctx: Context, start: Any) -> TrainState:
    s = ctx.settings
    stage = Stage("dpo", dpo_data(ctx, start), steps=s.dpo_steps, beta=s.dpo_beta)
    return _recipe(ctx, stage, optax.adam(s.dpo_lr), s.dpo_batch, start, 1)


def run_grpo(ctx: Context, start: Any) -> TrainState:
    s = ctx.settings
    return _grpo(ctx, start, prompt_data(ctx), MathReward(), "grpo", 2, s.grpo_steps,
                 s.max_new_tokens)  # fmt: skip


def run_code(ctx: Context, start: Any) -> TrainState:
    """GRPO on code questions, each completion's program run by the sandbox fleet."""
    if ctx.code_reward is None:
        raise ValueError("code_reward: the code stage needs the sandbox's reward, got None")
    s = ctx.settings
    return _grpo(ctx, start, prompt_data(ctx, code=True), ctx.code_reward, "code", 3,
                 s.code_steps, code_new_tokens(s))  # fmt: skip


def _grpo(
    ctx: Context,
    start: Any,
    prompts: Prompts,
    reward: Any,
    name: str,
    index: int,
    steps: int,
    max_new_tokens: int,
) -> TrainState:
    """One GRPO stage on ``Trainer`` in ``RUN_DIR/<name>``."""
    s = ctx.settings
    width = prompts.max_prompt_len + max_new_tokens
    objective = GRPOObjective(
        ctx.model, width - 1, beta=0.0, pretrained=start, sampling_temperature=s.grpo_temperature
    )
    rollout = SampledRollout(
        objective,
        reward,
        groups=s.grpo_groups,
        max_new_tokens=max_new_tokens,
        sampling=Sampling(temperature=s.grpo_temperature, eos_id=ctx.end_id),
        decode=ctx.tokenizer.decode,
    )
    trainer = Trainer(
        objective,  # type: ignore[arg-type]  # its ema_decay is a read-only property
        optax.adam(s.grpo_lr),
        key=jax.random.fold_in(jax.random.key(s.seed), index),
        rollout=rollout,
        progress=ctx.progress,
    )
    return trainer.fit(
        prompts.load(s.grpo_prompts),
        steps,
        log_every=s.log_every,
        run_dir=os.path.join(ctx.run_dir, name),
    )


STAGES = (("sft", run_sft), ("dpo", run_dpo), ("grpo", run_grpo))
CODE_STAGE = ("code", run_code)


def stages(settings: Settings) -> tuple[tuple[str, Any], ...]:
    """The stages a run trains, in order: the three above, then ``code`` with ``--code``."""
    return STAGES + ((CODE_STAGE,) if settings.code else ())

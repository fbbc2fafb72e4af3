"""The quickstart's three stages: SFT and DPO through ``dew.recipes.chain``, then GRPO.

* SFT: ``ChatMessages`` over the training problems' worked answers (loss on the assistant
  tokens), one single-stage ``Recipe`` so it gets its own optimizer (AdamW with warm-up and
  cosine decay) and batch.
* DPO (as RPO: the preference loss plus the chosen answers' NLL): on-policy
  ``PreferencePairs``: the SFT policy answers training questions (greedily and by sampling),
  and each wrong answer is paired with the right id where it parts from the closest correct
  answer (``dew.quickstart.pairs``); every drawn question it got right gives an anchor pair
  instead (its worked answer against a typical slip); a single-stage ``Recipe`` with the SFT
  policy as the frozen reference.
* GRPO: ``Prompts`` of the training questions in a single-stage ``Recipe`` whose stage samples
  ``groups`` answers per prompt at ``grpo_temperature`` until ``<|end|>``, decoded by the
  tokenizer and scored by ``MathReward``; the objective scores at the same temperature.

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

from dew.data import Loading
from dew.data.arithmetic import Problem, careless
from dew.data.chat import ChatMessages
from dew.data.chat.bpe import END
from dew.data.chat.template import ChatTokenizer, prompt_ids
from dew.data.preference import PreferencePairs
from dew.data.prompts import Prompts
from dew.files import atomic_write
from dew.inference import TextGeneration
from dew.models import load_pretrained
from dew.quickstart.config import Settings
from dew.quickstart.pairs import Pair, PreferenceCheck, build_pairs, slip_pair
from dew.recipes.chain import Recipe, Stage
from dew.recipes.chain_lora import MERGED
from dew.rewards import MathReward
from dew.trainer import TrainState

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


def _conversation(problem: Problem, answer: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": problem.question},
            {"role": "assistant", "content": answer},
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
    slips = careless(ctx.train, ctx.settings.sft_slip_rate, ctx.settings.seed)
    rows = [
        _conversation(p, (p.careless() if slip else None) or p.worked())
        for p, slip in zip(ctx.train, slips, strict=True)
    ]
    if ctx.settings.code:
        rows += [_code_conversation(p) for p in ctx.train[::4]]
    _write_jsonl(path, rows)
    s = ctx.settings
    return ChatMessages(path, ctx.tokenizer, seq_len=s.sft_seq_len, seed=s.seed, loading=LOADING)


def response_ids(ctx: Context, text: str) -> list[int]:
    """The ids of an assistant answer followed by ``<|end|>`` (what the model must write)."""
    return ctx.tokenizer.encode(text + END)


def dpo_pairs(ctx: Context, start: Any) -> list[Pair]:
    """The on-policy pairs of ``start`` (the SFT policy), kept in ``RUN_DIR/data/dpo.jsonl``.

    ``dpo_problems`` training questions (a seeded draw) are answered by the policy, greedily
    and ``dpo_samples`` times at ``dpo_temperature``; each wrong answer is paired with the
    right id where it parts from the closest correct answer (``dew.quickstart.pairs``). Only
    pairs the policy ranks wrong, or right by less than ``dpo_max_margin`` nats, are kept:
    the rest teach it nothing it does not already do. The file is written once, atomically,
    so a resumed run trains on the same pairs.
    """
    s = ctx.settings
    path = os.path.join(ctx.run_dir, "data", "dpo.jsonl")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return [_pair(json.loads(line)) for line in f if line.strip()]
    rng = np.random.default_rng([s.seed, 1])
    pool = [p for p in ctx.train if p.op in s.dpo_operators]
    picked = [pool[i] for i in rng.permutation(len(pool))[: s.dpo_problems]]
    items = [
        (p.question, prompt_ids(ctx.tokenizer, p.question), response_ids(ctx, p.worked()),
         str(p.answer))
        for p in picked
    ]  # fmt: skip
    pairs = build_pairs(
        TextGeneration(ctx.model).bind(start),
        ctx.tokenizer.decode,
        items,
        ctx.end_id,
        s.max_new_tokens,
        s.dpo_samples,
        s.dpo_temperature,
        jax.random.fold_in(jax.random.key(s.seed), 101),
    )
    if pairs:  # keep what the policy gets wrong or nearly so
        margins = PreferenceCheck(ctx.model, pairs, ctx.tokenizer.pad_id or 0).margins(start)
        pairs = [p for p, m in zip(pairs, margins, strict=True) if m < s.dpo_max_margin]
    pairs = pairs + anchor_pairs(ctx, picked, {p.question for p in pairs}, rng)
    if not pairs:
        raise RuntimeError(
            "dpo: the starting policy answered every sampled question right; there is nothing "
            "for DPO to prefer (raise dpo_problems or shorten SFT)"
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_jsonl(path, [{**dataclasses.asdict(p), **json.loads(p.record())} for p in pairs])
    return pairs


def anchor_pairs(
    ctx: Context, problems: list[Problem], covered: set[str], rng: np.random.Generator
) -> list[Pair]:
    """A pair for every problem in ``problems`` whose question no mistake pair covers: the
    worked answer against the same steps with one typical slip (``Problem.wrong``).

    These carry RPO's NLL term over the whole draw, not only over the questions the policy
    gets wrong; their preference term is nearly spent from the start (the policy already
    ranks the right step far above the slip).
    """
    out = []
    for p in problems:
        if p.question in covered:
            continue
        wrong = p.wrong(rng)
        out.append(
            slip_pair(
                prompt_ids(ctx.tokenizer, p.question),
                response_ids(ctx, p.worked()),
                response_ids(ctx, wrong),
                p.question,
                p.worked(),
                wrong,
            )
        )
    return out


def _pair(row: dict[str, Any]) -> Pair:
    fields = {f.name for f in dataclasses.fields(Pair)}
    values = {k: row[k] for k in fields}
    values["prompt"] = tuple(values["prompt"])
    values["prefix"] = tuple(values["prefix"])
    values["chosen_rest"] = tuple(values["chosen_rest"])
    return Pair(**values)


def dpo_data(ctx: Context, pairs: list[Pair]) -> PreferencePairs:
    """``PreferencePairs`` over ``pairs`` (see ``Pair.record`` for what is scored)."""
    width = max(len(p.context) + 1 + len(p.chosen_rest) for p in pairs)
    return PreferencePairs(
        records=tuple(p.record() for p in pairs),
        seq_len=width,
        pad_id=ctx.tokenizer.pad_id or 0,
        loading=LOADING,
        seed=ctx.settings.seed,
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
    """Run one single-stage chain in ``RUN_DIR/<stage.name>`` and return its final state.

    Each stage is its own ``Recipe`` because each has its own optimizer and batch, and
    because DPO's pairs are drawn from the policy the previous stage produced. A stage that
    trained an adapter (``--lora``) returns its state with ``params`` replaced by the merged
    weights the chain wrote (``RUN_DIR/<stage>/merged``), the policy the next stage starts
    from and the evaluator reads.
    """
    recipe = Recipe(
        model=ctx.model,
        optimizer=optimizer,
        key=jax.random.fold_in(jax.random.key(ctx.settings.seed), index),
        output=ctx.run_dir,
        batch=batch,
        stages=(stage,),
        pretrained=start,
        log_every=ctx.settings.log_every,
        progress=ctx.progress,
        checkpoint_every=ctx.settings.checkpoint_every,
    )
    (state,) = recipe.run()
    if stage.lora is None:
        return state
    merged = load_pretrained(os.path.join(ctx.run_dir, stage.name, MERGED), dtype="float32")
    return state.replace(params={"params": jax.device_get(dict(merged.variables)["params"])})


Outcome = tuple[TrainState, dict[str, Any]]


def run_sft(ctx: Context, start: Any) -> Outcome:
    s = ctx.settings
    stage = Stage("sft", sft_data(ctx), steps=s.sft_steps)
    return _recipe(ctx, stage, s.optimizer("sft"), s.sft_batch, start, 0), {}


def run_dpo(ctx: Context, start: Any) -> Outcome:
    """DPO on the SFT policy's own mistakes; reports how many pairs it ranks right before and
    after (``preference_accuracy_before`` / ``_after``) and a few pairs."""
    s = ctx.settings
    pairs = dpo_pairs(ctx, start)
    stage = Stage(
        "dpo",
        dpo_data(ctx, pairs),
        steps=s.dpo_steps,
        beta=s.dpo_beta,
        nll_weight=s.dpo_nll_weight,
        lora=s.lora("dpo"),
    )
    state = _recipe(ctx, stage, s.optimizer("dpo"), s.dpo_batch, start, 1)
    check = PreferenceCheck(ctx.model, pairs, ctx.tokenizer.pad_id or 0)
    extra = {
        "pairs": len(pairs),
        "preference_accuracy_before": check(start),
        "preference_accuracy_after": check(jax.device_get(state.params)),
        "pair_examples": [p.as_dict() for p in pairs[:3]],
    }
    return state, extra


def run_grpo(ctx: Context, start: Any) -> Outcome:
    s = ctx.settings
    return _grpo(ctx, start, prompt_data(ctx), MathReward(), "grpo", 2, s.grpo_steps,
                 s.max_new_tokens), {}  # fmt: skip


def run_code(ctx: Context, start: Any) -> Outcome:
    """GRPO on code questions, each completion's program run by the sandbox fleet."""
    if ctx.code_reward is None:
        raise ValueError("code_reward: the code stage needs the sandbox's reward, got None")
    s = ctx.settings
    return _grpo(ctx, start, prompt_data(ctx, code=True), ctx.code_reward, "code", 3,
                 s.code_steps, code_new_tokens(s)), {}  # fmt: skip


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
    """One GRPO stage through the chain: samples at ``grpo_temperature`` until ``<|end|>``,
    the reward reading the decoded text."""
    s = ctx.settings
    stage = Stage(
        name,
        prompts,
        steps=steps,
        beta=0.0,
        reward=reward,
        groups=s.grpo_groups,
        max_new_tokens=max_new_tokens,
        temperature=s.grpo_temperature,
        eos_id=ctx.end_id,
        decode=ctx.tokenizer.decode,
        lora=s.lora(name),
    )
    return _recipe(ctx, stage, s.optimizer(name), s.grpo_prompts, start, index)


STAGES = (("sft", run_sft), ("dpo", run_dpo), ("grpo", run_grpo))
CODE_STAGE = ("code", run_code)


def stages(settings: Settings) -> tuple[tuple[str, Any], ...]:
    """The stages a run trains, in order: the three above, then ``code`` with ``--code``."""
    return STAGES + ((CODE_STAGE,) if settings.code else ())

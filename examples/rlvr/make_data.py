"""Write the data of the RLVR example (``chain.yaml``) into a directory.

The task: add a small number to a two-digit one (``"47+2"``) and answer ``\\boxed{49}``.
The SFT demonstrations come from a careless tutor who, on a fixed share of the problems
(``--slip``, 0.7 by default), answers one too many (``\\boxed{50}``): after SFT the policy
writes that wrong answer most of the time, greedy decoding almost always, while sampling
still finds the right one often enough for GRPO's group baseline to reward it. The exact
answers of ``MathReward`` (``reward: math``) then remove the slip.

Files written to ``OUT`` (all small)::

    tokenizer/      a byte-level BPE chat tokenizer trained on the demonstrations
    sft.jsonl       {"messages": [user, assistant]} rows, the tutor's answers
    prompts.jsonl   {"prompt": [user], "ground_truth": "49"} rows: GRPO's prompts
    test.jsonl      the same for held-out problems (no operand pair of it is trained on)

Problems are ``a+b`` with ``10 <= a < 90`` and ``b`` in 1..3 (240 pairs); ``--held-out`` of
them (drawn by ``--seed``) go to ``test.jsonl`` only.

Run::

    python examples/rlvr/make_data.py examples/rlvr/data
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

from dew.data.chat import build_tokenizer, save_tokenizer


def _user(a: int, b: int) -> dict[str, str]:
    return {"role": "user", "content": f"{a}+{b}"}


def _rows(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write the files into")
    parser.add_argument("--seed", type=int, default=0, help="problem split and slips")
    parser.add_argument("--held-out", type=int, default=64, help="problems kept for test.jsonl")
    parser.add_argument("--slip", type=float, default=0.7, help="share of wrong demonstrations")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    problems = [(a, b) for a in range(10, 90) for b in range(1, 4)]
    rng.shuffle(problems)
    held_out, train = problems[: args.held_out], problems[args.held_out :]
    demos = []
    for _ in range(4):  # each training problem four times, each time slipping or not
        for a, b in train:
            answer = a + b + (1 if rng.random() < args.slip else 0)
            demos.append([_user(a, b), {"role": "assistant", "content": f"\\boxed{{{answer}}}"}])
    rng.shuffle(demos)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(m["content"] for demo in demos for m in demo)
    save_tokenizer(tokenizer, str(out / "tokenizer"))
    _rows(out / "sft.jsonl", [{"messages": demo} for demo in demos])
    for name, part in (("prompts.jsonl", train), ("test.jsonl", held_out)):
        _rows(out / name, [{"prompt": [_user(a, b)], "ground_truth": str(a + b)} for a, b in part])
    print(f"wrote {len(demos)} demonstrations, {len(train)} prompts, {len(held_out)} held out "
          f"to {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

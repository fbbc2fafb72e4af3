"""Write the warm-up transcripts of the tool-episodes example (``chain.yaml``) as a token file.

Each transcript is one 8-id row of the protocol ``square_tool.py`` speaks: the question
``[QUESTION, digit(x)]``, a call ``[CALL, EOS]``, the tool's ``digit(x * x)``, then an answer
``[SAY, digit(d), EOS]`` from a careless tutor: ``d`` is what the tool returned in three
transcripts of ten (``--right``) and one more than it (``(x * x + 1) % 10``) in the others.
The warm-up stage learns the protocol (call, then say one digit, then stop) and the tutor's
habit with it, so GRPO starts near a three-in-ten success rate, on episodes whose groups
nearly always hold both answers, and has one specific slip to remove: the added one.

Run::

    python examples/tool_episodes/make_data.py examples/tool_episodes/data
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from dew.data.tokens import write_tokens

EOS, CALL, SAY, QUESTION = 1, 2, 3, 14
#: The share of transcripts whose answer repeats the tool's result.
RIGHT = 0.3


def transcripts(rows: int, seed: int, right: float = RIGHT) -> np.ndarray:
    """``[rows, 8]`` transcripts with ``x`` in 0..3; the answer is ``x * x`` with probability
    ``right``, else ``(x * x + 1) % 10``."""
    if not 0.0 <= right <= 1.0:
        raise ValueError(f"right: expected a fraction in [0, 1], got {right!r}")
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, rows)
    said = np.where(rng.random(rows) < right, x**2, (x**2 + 1) % 10)
    columns = [np.full(rows, QUESTION), 4 + x, np.full(rows, CALL), np.full(rows, EOS),
               4 + x**2, np.full(rows, SAY), 4 + said, np.full(rows, EOS)]  # fmt: skip
    return np.stack(columns, axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write warmup.bin into")
    parser.add_argument("--rows", type=int, default=4096, help="transcripts to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--right", type=float, default=RIGHT, help="share of answers that repeat the tool's result"
    )
    args = parser.parse_args(argv)
    try:
        rows = transcripts(args.rows, args.seed, args.right)
    except ValueError as err:  # the one range check: transcripts'
        parser.error(f"--{err}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokens(out / "warmup.bin", rows.reshape(-1), "uint16")
    print(f"wrote {args.rows} transcripts to {out / 'warmup.bin'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

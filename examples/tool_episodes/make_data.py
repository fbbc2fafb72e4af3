"""Write the warm-up transcripts of the tool-episodes example (``chain.yaml``) as a token file.

Each transcript is one 8-id row of the protocol ``square_tool.py`` speaks: the question
``[QUESTION, digit(x)]``, a call ``[CALL, EOS]``, the tool's ``digit(x * x)``, then an answer
``[SAY, digit(d), EOS]`` whose digit ``d`` is drawn at random. The warm-up stage learns the
protocol (call, then say one digit, then stop) but not which digit is right, so GRPO starts
near a one-in-ten success rate and has to learn to repeat what the tool returned.

Run::

    python examples/tool_episodes/make_data.py examples/tool_episodes/data
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from dew.data.tokens import write_tokens

EOS, CALL, SAY, QUESTION = 1, 2, 3, 14


def transcripts(rows: int, seed: int) -> np.ndarray:
    """``[rows, 8]`` transcripts with ``x`` in 0..3 and a random answer digit."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, rows)
    said = rng.integers(0, 10, rows)
    columns = [np.full(rows, QUESTION), 4 + x, np.full(rows, CALL), np.full(rows, EOS),
               4 + x**2, np.full(rows, SAY), 4 + said, np.full(rows, EOS)]  # fmt: skip
    return np.stack(columns, axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write warmup.bin into")
    parser.add_argument("--rows", type=int, default=4096, help="transcripts to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokens(out / "warmup.bin", transcripts(args.rows, args.seed).reshape(-1), "uint16")
    print(f"wrote {args.rows} transcripts to {out / 'warmup.bin'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

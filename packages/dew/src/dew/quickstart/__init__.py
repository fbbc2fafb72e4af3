"""``dew quickstart``: the whole post-training story on a task generated in code.

A small decoder is trained from scratch on two-operand arithmetic (``dew.data.arithmetic``)
with a byte-level BPE tokenizer built on the fly (``dew.data.chat.bpe``): SFT on worked
answers, DPO on right/wrong pairs and GRPO with ``MathReward`` (``dew.quickstart.stages``).
Held-out accuracy by greedy decoding is measured before and after every stage
(``dew.rewards.accuracy``) and written, with every metric, to ``RUN_DIR/summary.json``
beside a PNG plot (``dew.quickstart.plot``). ``main(argv)`` is the command line.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dew quickstart`` with ``argv`` (the options after the command name)."""
    from dew.quickstart.command import main as _main

    return _main(argv)


__all__ = ["main"]

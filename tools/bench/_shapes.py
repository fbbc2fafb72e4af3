"""The Qwen3 model shapes the SFT and generation benchmarks build on both sides (Dew and
transformers), as ``Qwen3Config`` keywords: ``small`` for a shared CPU, ``qwen3-0.6b`` for the
real model's layout (no weights: both sides initialise their own), and ``tiny``, the GRPO step
bench's default model (``bench_grpo_step.py``), so that ``profile_step.py`` can profile a
step at the shapes of that bench's update.
"""

from __future__ import annotations

from typing import Any

from _rounds import add_device_argument

SHAPES = {
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=1088, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128),
}  # fmt: skip


def add_model_arguments(parser: Any) -> None:
    """The model flags of the model benches, defined once: --shape (a key of SHAPES), --dtype,
    --device (``_rounds.add_device_argument``) and --peak-tflops."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small",
                        help="random Qwen3 shape: tiny (0.56M parameters), small (5.2M) or qwen3-0.6b")  # fmt: skip
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="compute dtype of every contender (Dew keeps float32 parameters)")  # fmt: skip
    add_device_argument(parser)
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the card's datasheet dense rate for --dtype, TFLOP/s (e.g. 989 "
                        "for bf16 on an H100/H200 SXM): prints each contender's model FLOPs "
                        "utilisation (MFU) against it")  # fmt: skip

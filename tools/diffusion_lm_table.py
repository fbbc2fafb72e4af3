"""Autoregressive, masked-diffusion and block-diffusion models on the same sums, side by side.

Usage (Dew's own environment)::

    JAX_PLATFORMS=cpu .venv/bin/python tools/diffusion_lm_table.py [--steps 3000] [--seed 0]
        [--out table.json]

The data is made here: every sum ``a + b`` of two numbers ``0..99`` written as ten
characters, ``"07+45=052."`` (question, three-digit answer, end mark), one id per character
(14 real ids; id 14 is the diffusion models' mask). A seeded 10 % of the pairs is held out.
Three decoders of the same shape (two layers, width 64, four heads) train from scratch on the
same rows, batches and steps with AdamW:

- ``ar``: ``LMObjective``, next-token NLL over the row; answers by greedy decoding of three
  ids after the question;
- ``mdlm``: ``MaskedDiffusionObjective`` (MDLM, log-linear schedule) on the first nine ids;
  answers by filling a three-position canvas after the question (``CanvasGeneration``,
  LLaDA's low-confidence remasking, three steps, greedy);
- ``bd3``: ``BlockDiffusionObjective`` (BD3-LM, blocks of three) on the same nine ids;
  answers block-causally (the question is two finished blocks, the answer the third).

Printed per model: held-out exact-answer accuracy (the three digits right; its binomial
standard error), and held-out bits per token: the autoregressive model's NLL of its nine
predicted ids, the diffusion models' NLL bound over the nine ids (the average of
``--bound-draws`` noisings, so itself an estimate). The two kinds of number differ in what
they count (the autoregressive model never predicts the first id); they are printed side by
side, not as a like-for-like comparison. A machine record (CPU model, AVX-512, AMX) is
printed with the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.inference.canvas import Canvas, CanvasGeneration
from dew.models import build
from dew.objectives import BlockDiffusionObjective, LMObjective, MaskedDiffusionObjective
from dew.sampling import Sampling

CHARS = "0123456789+=.-"
REAL = len(CHARS)  # 14 real ids
MASK = REAL
SEQ = 9  # question (6) + answer (3); the row's tenth id is the end mark
QUESTION = 6


def encode(text: str) -> list[int]:
    return [CHARS.index(c) for c in text]


def rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out rows, int32 ``[N, 10]``."""
    texts = [f"{a:02d}+{b:02d}={a + b:03d}." for a in range(100) for b in range(100)]
    order = np.random.default_rng(seed).permutation(len(texts))
    ids = np.asarray([encode(t) for t in texts], np.int32)[order]
    held = len(texts) // 10
    return ids[held:], ids[:held]


def model() -> Any:
    return build(
        "causal_transformer",
        vocab_size=REAL + 1,
        max_seq_len=2 * SEQ,
        emb_features=64,
        num_layers=2,
        num_heads=4,
        mlp_features=128,
    )


def objectives() -> dict[str, Any]:
    m = model()
    return {
        "ar": LMObjective(m, SEQ),
        "mdlm": MaskedDiffusionObjective(m, SEQ, mask_id=MASK, real_tokens=REAL),
        "bd3": BlockDiffusionObjective(m, SEQ, block_size=3, mask_id=MASK, real_tokens=REAL),
    }


def train(objective: Any, train_rows: np.ndarray, steps: int, batch: int, seed: int) -> Any:
    """AdamW with a cosine decay from 3e-3; the same batches for every objective."""
    key = jax.random.key(seed)
    variables = objective.init(key)
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, 100, steps), weight_decay=0.01)
    state = opt.init(variables["params"])

    @jax.jit
    def step(params: Any, state: Any, text: jax.Array, key: jax.Array) -> Any:
        def loss(p: Any) -> jax.Array:
            total, weight, _ = objective.loss({**variables, "params": p}, {"text": text}, key)
            return total / weight

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    params = variables["params"]
    rng = np.random.default_rng(seed)
    for i in range(steps):
        text = train_rows[rng.integers(0, len(train_rows), batch)]
        params, state, _ = step(params, state, jnp.asarray(text), jax.random.fold_in(key, i))
    return {**variables, "params": params}


def ar_answers(objective: Any, variables: Any, held: np.ndarray) -> np.ndarray:
    """Greedy decoding of three ids after the question, ``[N, 3]``."""

    @jax.jit
    def next_id(ids: jax.Array) -> jax.Array:
        return jnp.argmax(objective.model.apply(variables, ids)[:, -1, :REAL], axis=-1)

    ids = jnp.asarray(held[:, :QUESTION])
    for _ in range(SEQ - QUESTION):
        ids = jnp.concatenate([ids, next_id(ids)[:, None].astype(jnp.int32)], axis=1)
    return np.asarray(ids[:, QUESTION:])


def canvas_answers(variables: Any, held: np.ndarray, block: bool) -> np.ndarray:
    canvas = Canvas(
        mask_id=MASK,
        real_tokens=REAL,
        steps=SEQ - QUESTION,
        remasking="low_confidence",
        block_length=3 if block else None,
        block_causal=block,
    )
    generate = CanvasGeneration(model(), variables, canvas=canvas)
    outs = generate(list(held[:, :QUESTION]), SEQ - QUESTION, 0, Sampling(temperature=0.0))
    return np.stack([o.ids for o in outs])


def bits(objective: Any, variables: Any, held: np.ndarray, draws: int) -> float:
    """Held-out bits per token (averaged over ``draws`` noisings for the diffusion models)."""
    evaluate = jax.jit(objective.evaluate)
    total = weight = 0.0
    for i in range(draws):
        sums = evaluate(variables, {"text": jnp.asarray(held)}, jax.random.key(1000 + i))
        total += float(sums["loss"])
        weight += float(sums["weight"])
    return total / weight / math.log(2)


def machine() -> dict[str, Any]:
    info = open("/proc/cpuinfo").read() if sys.platform == "linux" else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "")
    return {"cpu": name, "avx512f": "avx512f" in info, "amx_tile": "amx_tile" in info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bound-draws", type=int, default=8)
    parser.add_argument("--out", default=None, help="also write the table as JSON here")
    args = parser.parse_args(argv)
    train_rows, held = rows(args.seed)
    truth = held[:, QUESTION:SEQ]
    table = {}
    for name, objective in objectives().items():
        start = time.perf_counter()
        variables = train(objective, train_rows, args.steps, args.batch, args.seed)
        seconds = time.perf_counter() - start
        if name == "ar":
            answers, draws = ar_answers(objective, variables, held), 1
        else:
            answers, draws = canvas_answers(variables, held, name == "bd3"), args.bound_draws
        acc = float(np.mean(np.all(answers == truth, axis=1)))
        table[name] = {
            "accuracy": acc,
            "accuracy_se": math.sqrt(acc * (1 - acc) / len(held)),
            "bits_per_token": bits(objective, variables, held, draws),
            "train_seconds": round(seconds, 1),
        }
    record = {"steps": args.steps, "batch": args.batch, "seed": args.seed, "machine": machine()}
    print(f"machine: {record['machine']}")
    print("| model | held-out exact answers (SE) | held-out bits/token | train s |")
    print("|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | {row['accuracy']:.3f} ({row['accuracy_se']:.3f}) | "
              f"{row['bits_per_token']:.3f} | {row['train_seconds']} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**record, "table": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

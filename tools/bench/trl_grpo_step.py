"""TRL 1.16's GRPOTrainer step on CPU as a timing worker; bench_grpo_step.py drives it.

Runs inside the reference venv (tools/reference_env.sh). Builds the same small Qwen3 shape
as the Dew side (random weights, written to a temporary directory because GRPOTrainer loads
its reference model from a path), a word-level tokenizer over ids ``t0 .. t{V-4}``, prompts
of the same length range, and a reward that counts ``t7``. Trains ``--steps`` steps with
``per_device_train_batch_size = prompts * groups`` and ``num_generations = groups`` (one
generation batch per optimizer step), KL beta 0.04, temperature 1, top-k 50.

A JSON-lines worker (the loop of tools/bench/_rounds.py): the first line names the torch
version and thread count (``DEW_BENCH_THREADS``); then ``{"op": "steps", "steps": k}`` lets the
trainer, which runs in a thread paused by a callback between requests, take k more optimizer
steps and answers ``step_s`` (wall time of each, generation included) and ``maxrss_mib``
(peak resident set of the process so far, both models and generation included).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in (("prompts", 8), ("groups", 4), ("prompt-len", 32), ("new-tokens", 32),
                          ("vocab", 512), ("width", 128), ("layers", 2)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _rounds import WORKER_LOOP

    loop: dict = {}
    exec(WORKER_LOOP, loop)  # serve() and torch_threads() of the shared harness
    threads = loop["torch_threads"](torch)
    v, d, p, r = args.vocab, args.width, args.prompt_len, args.new_tokens
    vocab = {f"t{i}": i for i in range(v - 3)}
    vocab.update({"<pad>": v - 3, "<eos>": v - 2, "<unk>": v - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.padding_side = "left"
    config = Qwen3Config(
        vocab_size=v, hidden_size=d, num_hidden_layers=args.layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=d // 4, intermediate_size=4 * d,
        max_position_embeddings=p + r, tie_word_embeddings=True, pad_token_id=v - 3,
        eos_token_id=v - 2, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    prompts = [
        " ".join(f"t{i}" for i in rng.integers(1, v - 3, rng.integers(p // 2, p + 1)))
        for _ in range(args.prompts * 64)
    ]

    def reward(completions, **_):
        return [sum(t == "t7" for t in c.split()) / max(len(c.split()), 1) for c in completions]

    stamps: list[float] = []
    budget, go, done = [0], threading.Event(), threading.Event()

    class Gate(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())
            budget[0] -= 1
            if budget[0] <= 0:
                done.set()
                go.wait()
                go.clear()
                stamps.append(time.perf_counter())

    tmp = tempfile.mkdtemp()
    Qwen3ForCausalLM(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    grpo = GRPOConfig(
        output_dir=f"{tmp}/out", per_device_train_batch_size=args.prompts * args.groups,
        num_generations=args.groups, max_completion_length=r, max_steps=1_000_000,
        logging_steps=1_000_000, report_to="none", use_cpu=True, bf16=False, beta=0.04,
        temperature=1.0, top_k=50, learning_rate=1e-4, save_strategy="no", seed=0,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=tmp, reward_funcs=reward, args=grpo, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[Gate()],
    )  # fmt: skip
    budget[0] = 1
    threading.Thread(target=trainer.train, daemon=True).start()
    done.wait()  # the first step: warm-up
    done.clear()

    def steps(steps: int) -> dict:
        stamps.clear()
        budget[0] = steps
        go.set()
        done.wait()
        done.clear()
        return {
            "step_s": [b - a for a, b in zip(stamps[:-1], stamps[1:])],
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    loop["serve"]({"steps": steps}, {"torch": torch.__version__, "threads": threads})


if __name__ == "__main__":
    main()

"""TRL's SFTTrainer on CPU, full or with a PEFT LoRA adapter, as a worker of bench_lora.py.

Runs inside the reference venv (tools/reference_env.sh: torch CPU, transformers, TRL, PEFT).
Three modes, the first argument choosing:

``write DIR CONFIG_JSON SEQ``
    Write a random Qwen3 checkpoint (``Qwen3Config(**CONFIG_JSON)``, tied embeddings, float32,
    seed 0) to ``DIR`` and print ``{"params": n}``. Both sides of the bench load it, so Dew
    and torch start from the same weights.
``serve KIND DIR BATCH SEQ TOKENIZER``
    ``KIND`` is ``full`` (every parameter trains) or ``peft`` (peft's ``LoraConfig`` with the
    rank, alpha and targets of ``LORA`` below). SFTTrainer runs in a thread that a callback
    pauses after each request's steps (the JSON-lines loop of tools/bench/_rounds.py):
    ``{"op": "steps", "steps": k}`` answers ``step_s`` (k wall times); ``{"op": "optimizer"}``
    answers the bytes of AdamW's state (``moment_bytes``: every ``exp_avg`` and
    ``exp_avg_sq``; ``state_bytes``: every tensor in ``optimizer.state``, step counters
    included) and of the trainable and all parameters.
``probe KIND DIR BATCH SEQ TOKENIZER STEPS``
    A fresh process for one peak-memory figure: build the same trainer, train ``STEPS``
    steps, print ``{"vmhwm": bytes, "rss_imports": bytes}`` (Linux ``VmHWM`` at the end, and
    ``VmRSS`` after the imports, before any model exists).

The rows are random token ids (``16 x BATCH`` rows of ``SEQ``), already tokenised; the
tokenizer only pads. Gradient checkpointing is off (SFTConfig turns it on by default; Dew's
step does not recompute activations), the learning rate constant, logging and saving off.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]}  # fmt: skip


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (``VmHWM``, ``VmRSS``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/self/status: expected a {field} line, found none")


def write(directory: str, config_json: str, seq: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**json.loads(config_json), max_position_embeddings=max(1024, seq),
                         tie_word_embeddings=True, rope_theta=10000.0)  # fmt: skip
    model = Qwen3ForCausalLM(config).float()
    model.save_pretrained(directory)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters())}), flush=True)


def trainer_for(kind: str, directory: str, batch: int, seq: int, tok: str, steps: int,
                callbacks: list) -> Any:  # fmt: skip
    """SFTTrainer on the checkpoint in ``directory``, full or with peft's LoRA."""
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM
    from trl import SFTConfig, SFTTrainer

    model = Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    vocab = model.config.vocab_size
    rows = torch.randint(1, vocab, (batch * 16, seq), generator=torch.Generator().manual_seed(1))
    peft_config = None
    if kind == "peft":
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **LORA)
    elif kind != "full":
        raise ValueError(f"kind: expected full or peft, got {kind!r}")
    args = SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch,
                     max_steps=steps, max_length=seq, packing=False, learning_rate=1e-4,
                     optim="adamw_torch", report_to="none", logging_strategy="no",
                     save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                     lr_scheduler_type="constant", warmup_steps=0, bf16=False,
                     gradient_checkpointing=False, disable_tqdm=True)  # fmt: skip
    return SFTTrainer(model=model, args=args, peft_config=peft_config, callbacks=callbacks,
                      train_dataset=Dataset.from_dict({"input_ids": rows.tolist()}),
                      processing_class=PreTrainedTokenizerFast.from_pretrained(tok))  # fmt: skip


def optimizer_bytes(trainer: Any) -> dict[str, int]:
    """AdamW's moments and whole state, and the trainable and all parameters, in bytes."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    moments = state = 0
    for entry in optimizer.state.values():
        for key, tensor in entry.items():
            size = tensor.numel() * tensor.element_size()
            state += size
            moments += size if key in ("exp_avg", "exp_avg_sq") else 0
    params = list(trainer.model.parameters())
    return {"moment_bytes": moments, "state_bytes": state,
            "trainable_bytes": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad)}  # fmt: skip


def serve(kind: str, directory: str, batch: int, seq: int, tok: str) -> None:
    import peft
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _rounds import WORKER_LOOP

    loop: dict = {}
    exec(WORKER_LOOP, loop)  # serve() and torch_threads() of the shared harness
    threads = loop["torch_threads"](torch)
    stamps: list[float] = []
    budget, go, done = [0], threading.Event(), threading.Event()

    class Gate(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())
            budget[0] -= 1
            if budget[0] <= 0:
                done.set()
                go.wait()
                go.clear()
                stamps.append(time.perf_counter())

    trainer = trainer_for(kind, directory, batch, seq, tok, 1_000_000, [Gate()])
    budget[0] = 2
    threading.Thread(target=trainer.train, daemon=True).start()
    done.wait()  # two warm-up steps
    done.clear()

    def steps(steps: int) -> dict:
        stamps.clear()
        budget[0] = steps
        go.set()
        done.wait()
        done.clear()
        return {"step_s": [b - a for a, b in zip(stamps[:-1], stamps[1:])]}

    info = {"torch": torch.__version__, "threads": threads, "trl": trl.__version__,
            "peft": peft.__version__, "transformers": transformers.__version__}  # fmt: skip
    loop["serve"]({"steps": steps, "optimizer": lambda: optimizer_bytes(trainer)}, info)


def probe(kind: str, directory: str, batch: int, seq: int, tok: str, steps: int) -> None:
    import torch  # noqa: F401  (counted in rss_imports, as the other side's jax is)
    import trl  # noqa: F401

    rss_imports = status_bytes("VmRSS")
    trainer = trainer_for(kind, directory, batch, seq, tok, steps, [])
    trainer.train()
    print(json.dumps({"vmhwm": status_bytes("VmHWM"), "rss_imports": rss_imports}), flush=True)


def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "write":
        write(rest[0], rest[1], int(rest[2]))
    elif mode == "serve":
        serve(rest[0], rest[1], int(rest[2]), int(rest[3]), rest[4])
    elif mode == "probe":
        probe(rest[0], rest[1], int(rest[2]), int(rest[3]), rest[4], int(rest[5]))
    else:
        raise SystemExit(f"mode: expected write, serve or probe, got {mode!r}")


if __name__ == "__main__":
    main()

"""Record TRL 1.16.0's chat tokenisation and assistant masks for Dew's chat parity test.

Runs in the reference venv (tools/reference_env.sh): builds the small byte-level BPE
tokenizer of packages/dew/tests/_chat_tokenizer.py (its template marks assistant output with
{% generation %}), constructs TRL's own SFTTrainer with assistant_only_loss=True on a tiny
random Qwen3 model, and reads back the tokenised training dataset (input_ids and
assistant_masks). Writes tests/fixtures/chat/{tokenizer/, trl_sft.json, trl_sft.meta.json}.

    $(tools/reference_env.sh) tools/parity_chat.py
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")


def load_helper():
    path = os.path.join(ROOT, "packages", "dew", "tests", "_chat_tokenizer.py")
    spec = importlib.util.spec_from_file_location("_chat_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extra_conversations() -> list[dict]:
    return [
        {"messages": [
            {"role": "user", "content": "Tom had a red ball."},
            {"role": "assistant", "content": "He kicked it."},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "Four. The answer is 4."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Sunny."},
        ]},
        {"messages": [
            {"role": "system", "content": "Answer with tools."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "Paris is sunny; Rome has rain."},
        ], "tools": None},
    ]  # fmt: skip


def main() -> None:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from trl import SFTConfig, SFTTrainer

    helper = load_helper()
    tok_dir = os.path.join(OUT, "tokenizer")
    helper.build_tokenizer(tok_dir)
    conversations = copy.deepcopy(helper.CONVERSATIONS) + extra_conversations()
    conversations[-1]["tools"] = conversations[2]["tools"]
    rows = []
    for conv in conversations:
        messages = conv.get("messages", conv.get("prompt"))  # verl's layout -> TRL's messages
        row = {"messages": messages}
        # datasets needs one schema: pass tools as JSON text, which TRL parses back
        row["tools"] = json.dumps(conv["tools"]) if conv.get("tools") else None
        rows.append(row)
    for row in rows:  # one schema for every message: tool_calls as JSON-able lists or absent
        for m in row["messages"]:
            m.setdefault("tool_calls", None)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=tokenizer.vocab_size + 8, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=512)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, assistant_only_loss=True, report_to="none",
                         max_length=None, packing=False, use_cpu=True)  # fmt: skip
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer)  # fmt: skip
        ds = trainer.train_dataset
        ids = [list(map(int, x)) for x in ds["input_ids"]]
        # TRL folds assistant_masks into labels (-100 outside the assistant tokens)
        masks = [[int(v != -100) for v in x] for x in ds["labels"]]
    out = {"conversations": conversations, "input_ids": ids, "assistant_masks": masks}
    with open(os.path.join(OUT, "trl_sft.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)

    def sha(path: str) -> str:
        return hashlib.sha256(open(path, "rb").read()).hexdigest()

    meta = {
        "package": "trl",
        "version": trl.__version__,
        "transformers": transformers.__version__,
        "tokenizers": md.version("tokenizers"),
        "function": "trl.SFTTrainer(assistant_only_loss=True).train_dataset: input_ids, and "
        "labels != -100 as the assistant mask (trl.data_utils._tokenize -> "
        "apply_chat_template(return_assistant_tokens_mask=True), then build_labels)",
        "options": {"packing": False, "max_length": None},
        "tokenizer_sha256": {n: sha(os.path.join(tok_dir, n)) for n in sorted(os.listdir(tok_dir))},
        "python": sys.version.split()[0],
    }
    with open(os.path.join(OUT, "trl_sft.meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {len(ids)} conversations, {sum(map(len, ids))} tokens, "
          f"{sum(map(sum, masks))} assistant tokens")  # fmt: skip


if __name__ == "__main__":
    main()

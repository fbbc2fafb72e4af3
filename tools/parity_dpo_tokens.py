"""Record TRL 1.16.0's DPO tokenisation of text and conversational preference pairs.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_dpo_tokens.py [--wheel-sha256 HASH]

(offline, pass the TRL wheel's sha256 that ``tests/fixtures/dpo/trl_dpo.json`` records).

Two small tokenizers are trained here, in code, and saved under
``tests/fixtures/dpo_tokens/<name>/`` so Dew's test loads the very same files:

* ``chatml``: byte-level BPE, no BOS, ``<|im_end|>`` as EOS, a ChatML template (Qwen-like);
* ``bos``: a Metaspace (SentencePiece-like) BPE whose post-processor puts ``<s>`` first,
  ``</s>`` as EOS, and a template that writes ``{{ bos_token }}`` itself (Llama-like).

For each tokenizer a real ``DPOTrainer`` (tiny random Qwen3 policy, CPU) prepares the pairs
with its own ``_prepare_dataset`` (prompt extraction, the EOS appended to text completions,
tokenisation through the tokenizer or ``apply_chat_template``, the prompt/completion split at
the common prefix), one dataset per layout, since TRL picks the layout from a dataset's first
row. TRL's ``DataCollatorForPreference`` (``max_length=None``) then joins each example into
the rows it trains on: ``prompt_ids + chosen_ids`` and its completion mask (0 on the prompt,
1 on the completion). The sidecar ``tests/fixtures/dpo_tokens/trl_dpo_tokens.json`` holds
the pairs, TRL's ``prompt_ids``/``chosen_ids``/``rejected_ids`` and the collated rows, with
TRL's version, its wheel's sha256 and the tokenizer files' sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import transformers
import trl
from reference_wheel import atomic_write, wheel_sha256

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "dpo_tokens"
TRL_VERSION = "1.16.0"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|role|>{{ m.role }}<|content|>{{ m.content }}<|eot|>"
    "{% endfor %}{% if add_generation_prompt %}<|role|>assistant<|content|>{% endif %}"
)
CORPUS = [
    "The sky is blue. The grass is green. What is two plus two? Four. Five.",
    "Say hello there. Help me. The capital of France is Paris, not Rome.",
    "Café au lait, s'il vous plaît: très bon ☕. Ünïcödé is fün. 你好 世界 不好",
    "system user assistant You are terse. Tom had a red ball. He kicked it. No. Now. Done.",
] * 20

TEXT_PAIRS = [
    # The prompt ends without a space; the completions start with one (TRL's usual layout).
    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    # The prompt ends with a space, which BPE merges into the first completion word.
    {"prompt": "What is two plus two? ", "chosen": "Four.", "rejected": "Five."},
    # The prompt ends inside a word.
    {"prompt": "Say hel", "chosen": "lo there.", "rejected": "p me."},
    {"prompt": "Café au lait, s'il vous plaît:", "chosen": " très bon ☕", "rejected": " 不好"},
    # A completion that already ends with the EOS text gets no second EOS.
    {"prompt": "Stop.", "chosen": " Done.{eos}", "rejected": " Not done."},
    {"prompt": "", "chosen": "Yes.", "rejected": "No."},
    {
        "prompt": "Tom had a red ball. " * 12 + "Then",
        "chosen": " he kicked it to his dog." * 8,
        "rejected": " the grass was green." * 8,
    },
]
TEXT_IMPLICIT = [
    {"chosen": "The capital of France is Paris.", "rejected": "The capital of France is Rome."},
    {"chosen": "Ünïcödé is fün", "rejected": "Ünïcödé is hard"},
]


# Text pairs for TRL's implicit-prompt split alone (``trl.data_utils.extract_prompt``).
SPLITS = [
    ("The sky is blue.", "The sky is green."),
    ("Yes", "Yes!"),
    ("Same text", "Same text"),
    ("a b c", "a b d"),
    ("x  y", "x  z"),
    ("Ünïcödé is fün", "Ünïcödé is hard"),
]


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


CONVERSATIONS = [
    {
        "prompt": [_user("What is two plus two?")],
        "chosen": [_assistant("Four.")],
        "rejected": [_assistant("Five.")],
    },
    {  # a multi-turn prompt
        "prompt": [
            {"role": "system", "content": "You are terse."},
            _user("Tom had a red ball."),
            _assistant("He kicked it."),
            _user("Then?"),
        ],
        "chosen": [_assistant("The dog ran after it.")],
        "rejected": [_assistant("The sky is green.")],
    },
    {
        "prompt": [_user("Café au lait, s'il vous plaît?")],
        "chosen": [_assistant("Très bon ☕")],
        "rejected": [_assistant("不好")],
    },
    {
        "prompt": [_user("Tom had a red ball. " * 10)],
        "chosen": [_assistant("He kicked it to his dog. " * 8)],
        "rejected": [_assistant("The grass is green. " * 8)],
    },
    {  # several completion messages: TRL trains on all of them, Dew on the assistant ones
        "prompt": [_user("Tom had a red ball.")],
        "chosen": [_assistant("He kicked it."), _user("Then?"), _assistant("The dog ran.")],
        "rejected": [_assistant("No."), _user("Then?"), _assistant("Five.")],
    },
]
CONVERSATIONS_IMPLICIT = [
    {
        "chosen": [_user("The capital of France?"), _assistant("Paris.")],
        "rejected": [_user("The capital of France?"), _assistant("Rome.")],
    },
]


def _build(name: str, directory: Path) -> None:
    """Train one tokenizer and write ``tokenizer.json`` and ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if name == "chatml":
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        config = {"chat_template": CHATML, "eos_token": "<|im_end|>",
                  "pad_token": "<|endoftext|>", "bos_token": None}  # fmt: skip
    else:
        special = ["<unk>", "<s>", "</s>", "<|eot|>", "<|role|>", "<|content|>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        alphabet = []
        config = {"chat_template": BOS_TEMPLATE, "eos_token": "</s>", "pad_token": "<unk>",
                  "bos_token": "<s>", "unk_token": "<unk>"}  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    if name == "bos":
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=4096,
                  clean_up_tokenization_spaces=False)  # fmt: skip
    text = json.dumps(config, indent=1, ensure_ascii=False) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


def _rows(name: str, eos: str) -> dict[str, list[dict]]:
    """The pairs of each layout group, the EOS text filled in for ``name``'s tokenizer."""
    text = [{k: v.replace("{eos}", eos) for k, v in pair.items()} for pair in TEXT_PAIRS]
    return {
        "text": text,
        "text_implicit": TEXT_IMPLICIT,
        "conversational": CONVERSATIONS,
        "conversational_implicit": CONVERSATIONS_IMPLICIT,
    }


def _trl_rows(directory: Path, groups: dict[str, list[dict]], workdir: str) -> dict[str, list]:
    """TRL's prepared examples and collated rows for every group, in order."""
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer) + 8, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=1024)  # fmt: skip
    args = DPOConfig(output_dir=workdir, max_length=None, report_to="none", use_cpu=True,
                     dataset_num_proc=None)  # fmt: skip
    first = Dataset.from_list(groups["text"])
    trainer = DPOTrainer(model=Qwen3ForCausalLM(config), ref_model=Qwen3ForCausalLM(config),
                         args=args, train_dataset=first, processing_class=tokenizer)  # fmt: skip
    collator = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id, max_length=None)
    out: dict[str, list] = {}
    for group, pairs in groups.items():
        if group == "text":
            prepared = trainer.train_dataset
        else:
            prepared = trainer._prepare_dataset(Dataset.from_list(pairs), tokenizer, args, group)
        records = []
        for pair, example in zip(pairs, prepared, strict=True):
            ids = {
                k: [int(t) for t in example[k]]
                for k in ("prompt_ids", "chosen_ids", "rejected_ids")
            }
            batch = collator([ids])  # rows: chosen, rejected (right-padded to one width)
            widths = batch["attention_mask"].sum(dim=1).tolist()
            rows = [batch["input_ids"][i, :w].tolist() for i, w in enumerate(widths)]
            masks = [batch["completion_mask"][i, :w].tolist() for i, w in enumerate(widths)]
            records.append({"pair": pair, **ids, "input_ids": rows, "completion_mask": masks})
        out[group] = records
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-sha256", help="the trl wheel's sha256, if already known")
    args = parser.parse_args()
    if trl.__version__ != TRL_VERSION:
        raise SystemExit(f"trl version: expected {TRL_VERSION}, found {trl.__version__}")
    tokenizers_out = {}
    for name in ("chatml", "bos"):
        directory = OUT / name
        _build(name, directory)
        eos = json.loads((directory / "tokenizer_config.json").read_text())["eos_token"]
        with tempfile.TemporaryDirectory() as workdir:
            groups = _trl_rows(directory, _rows(name, eos), workdir)
        files = {f.name: _sha(f) for f in sorted(directory.iterdir())}
        tokenizers_out[name] = {"files_sha256": files, "groups": groups}
    import tokenizers
    from trl.data_utils import extract_prompt

    splits = []
    for chosen, rejected in SPLITS:
        split = extract_prompt({"chosen": chosen, "rejected": rejected})
        splits.append({"chosen": chosen, "rejected": rejected,
                       "trl": [split["prompt"], split["chosen"], split["rejected"]]})  # fmt: skip
    sidecar = {
        "package": "trl",
        "version": trl.__version__,
        "wheel_sha256": wheel_sha256("trl", TRL_VERSION, args.wheel_sha256),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "function": "trl.trainer.dpo_trainer.DPOTrainer._prepare_dataset, then "
        "DataCollatorForPreference on one example at a time, each row cut to its attention mask",
        "recorder": "tools/parity_dpo_tokens.py",
        "options": {"max_length": None},
        "tokenizers_used": tokenizers_out,
        "extract_prompt": splits,
    }
    text = json.dumps(sidecar, indent=1, ensure_ascii=False) + "\n"
    atomic_write(
        OUT / "trl_dpo_tokens.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8")
    )
    print(f"wrote {OUT / 'trl_dpo_tokens.json'}")


if __name__ == "__main__":
    main()

"""A byte-level BPE tokenizer with a compact chat template, trained in code on a task's text
(``dew quickstart`` builds one on its arithmetic).

Pre-tokenization splits every digit on its own (so numbers are read digit by digit, never
as learned multi-digit pieces) and then applies GPT-2's byte-level split; the BPE merges,
learned from the task's own worked answers, only shorten the fixed text (``boxed`` and the
like). Four special tokens frame a conversation::

    <|user|>37+48<|end|><|assistant|>37+48=85 \\boxed{85}<|end|>

``<|end|>`` closes every message and is the end-of-sequence id generation stops on;
``<|pad|>`` pads rows. The template appends ``<|assistant|>`` as the generation prompt, so
the assistant span of a rendered conversation is its content and the closing ``<|end|>``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from dew.data.chat.template import ChatTokenizer
from dew.files import atomic_path, atomic_write

PAD, USER, ASSISTANT, END = "<|pad|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL = (PAD, USER, ASSISTANT, END)

TEMPLATE = (
    "{%- for message in messages %}"
    "<|{{ message.role }}|>{{ message.content }}<|end|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(corpus: Iterable[str], merges: int = 32) -> ChatTokenizer:
    """Train the tokenizer on ``corpus`` with at most ``merges`` merges; deterministic.

    The vocabulary is the 256 byte symbols, the four special tokens and the merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if merges < 0:
        raise ValueError(f"merges: expected >= 0, got {merges}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + len(SPECIAL) + merges,
        special_tokens=list(SPECIAL),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer)
    special = {"pad_token": PAD, "eos_token": END}
    return ChatTokenizer(tok, TEMPLATE, special)


def save_tokenizer(tokenizer: ChatTokenizer, directory: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (loadable by ``ChatTokenizer.load``
    and by transformers' ``PreTrainedTokenizerFast``)."""
    import json

    os.makedirs(directory, exist_ok=True)
    with atomic_path(os.path.join(directory, "tokenizer.json")) as tmp:
        tokenizer.tokenizer.save(tmp)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": tokenizer.chat_template,
        "pad_token": PAD,
        "eos_token": END,
    }
    with atomic_write(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def token_id(tokenizer: ChatTokenizer, text: str) -> int:
    """The id of one special token string."""
    value = tokenizer.tokenizer.token_to_id(text)
    if value is None:
        raise KeyError(f"tokenizer: no token {text!r}")
    return int(value)


def vocab_size(tokenizer: ChatTokenizer) -> int:
    """How many ids ``tokenizer`` gives out: the embedding rows a decoder needs for it
    (special tokens and merges included)."""
    return int(tokenizer.tokenizer.get_vocab_size())


__all__ = [
    "ASSISTANT",
    "END",
    "PAD",
    "SPECIAL",
    "TEMPLATE",
    "USER",
    "build_tokenizer",
    "save_tokenizer",
    "token_id",
    "vocab_size",
]

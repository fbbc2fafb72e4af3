"""A small byte-level BPE tokenizer with a Qwen-style chat template, built in code.

Used by the chat tests and by tools/parity_chat.py (which needs only ``tokenizers``), so both
sides see the same files. The template supports a system message, tool schemas, assistant
tool calls and tool messages, and marks assistant output with ``{% generation %}`` so
transformers can return its assistant mask.
"""

from __future__ import annotations

import json
import os

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}<|im_start|>system\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message.content or '' }}"
    "{%- if message.tool_calls %}{% for call in message.tool_calls %}"
    "<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endgeneration %}"
    "{% elif message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "What is two plus two? Four. The answer is 4.",
    "You are a helpful assistant. Tools: get_weather(city). Weather in Paris is sunny.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "Tom had a red ball. He kicked it to his dog. The dog ran after it.",
    "system user assistant tool tool_call function parameters type object string",
] * 20


def build_tokenizer(directory: str, vocab_size: int = 420) -> str:
    """Train the tokenizer and write tokenizer.json and tokenizer_config.json; return the dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": TEMPLATE,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return directory


CONVERSATIONS = [
    {
        "messages": [
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "Four."},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tom had a red ball."},
            {"role": "assistant", "content": "He kicked it to his dog."},
            {"role": "user", "content": "Then?"},
            {"role": "assistant", "content": "The dog ran after it."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny in Paris."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather of a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    },
    {
        "prompt": [
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "4"},
        ]
    },
]

"""Chat data for SFT: ``Role`` and ``ChatMessages``; ``prompt_ids`` (a user question and the
generation prompt, as ids); and a small byte-level BPE tokenizer trained in code
(``dew.data.chat.bpe``: ``build_tokenizer``, ``save_tokenizer``, ``token_id``,
``vocab_size``). Everything but ``Role`` resolves lazily."""

from dew.data.chat.roles import Role
from dew.lazy import lazy_exports

__getattr__, __dir__, _lazy = lazy_exports(
    __name__,
    {
        "ChatMessages": ".messages",
        "prompt_ids": ".template",
        "build_tokenizer": ".bpe",
        "save_tokenizer": ".bpe",
        "token_id": ".bpe",
        "vocab_size": ".bpe",
    },
)

__all__ = [
    "ChatMessages",
    "Role",
    "build_tokenizer",
    "prompt_ids",
    "save_tokenizer",
    "token_id",
    "vocab_size",
]

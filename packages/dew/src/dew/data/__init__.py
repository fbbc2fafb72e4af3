"""Host-side data for the Trainer: ``Dataset``, ``Loading``, token files and chat data.

``dew.data.chat`` (``Role``, ``ChatMessages``) is imported lazily; the preference and prompt
readers of the RL objectives live beside these modules.
"""

from dew.data.dataset import Dataset, IndexedSource, IndexedStream, Loading, Partition
from dew.data.tokens import TokenFile, open_tokens, write_tokens

__all__ = [
    "ChatMessages",
    "Dataset",
    "IndexedSource",
    "IndexedStream",
    "Loading",
    "Partition",
    "PreferencePairs",
    "Prompts",
    "Role",
    "TokenFile",
    "open_tokens",
    "write_tokens",
]


_LAZY = {
    "ChatMessages": "dew.data.chat",
    "Role": "dew.data.chat",
    "PreferencePairs": "dew.data.preference",
    "Prompts": "dew.data.prompts",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dew.data' has no attribute {name!r}")

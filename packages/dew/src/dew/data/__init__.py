"""Host-side data for the Trainer: ``Dataset``, ``Loading``, token files and chat data.

Chat data (``Role``, ``ChatMessages``) is imported from ``dew.data.chat``. The preference and
prompt readers of the RL objectives live beside these modules and resolve lazily, and so does
``dew.data.arithmetic`` (``Problem``, ``split``, ``careless``: two-operand arithmetic problems
generated in code).
"""

from dew.data.dataset import Dataset, IndexedSource, IndexedStream, Loading, Partition
from dew.data.tokens import TokenFile, open_tokens, write_tokens
from dew.lazy import lazy_exports

__getattr__, __dir__, _lazy = lazy_exports(
    __name__,
    {"PreferencePairs": ".preference", "Prompts": ".prompts", "Problem": ".arithmetic"},
)

__all__ = [
    "Dataset",
    "IndexedSource",
    "IndexedStream",
    "Loading",
    "Partition",
    "PreferencePairs",
    "Problem",
    "Prompts",
    "TokenFile",
    "open_tokens",
    "write_tokens",
]

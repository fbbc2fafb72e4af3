"""Chat data for SFT: ``Role`` and ``ChatMessages`` (which resolves lazily)."""

from dew.data.chat.roles import Role
from dew.lazy import lazy_exports

__getattr__, __dir__, _lazy = lazy_exports(__name__, {"ChatMessages": ".messages"})

__all__ = ["ChatMessages", "Role"]

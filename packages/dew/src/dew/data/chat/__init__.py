"""Chat data for SFT: ``Role`` and ``ChatMessages``."""

from dew.data.chat.roles import Role

__all__ = ["ChatMessages", "Role"]


def __getattr__(name: str):
    if name == "ChatMessages":
        from dew.data.chat.messages import ChatMessages

        return ChatMessages
    raise AttributeError(f"module 'dew.data.chat' has no attribute {name!r}")

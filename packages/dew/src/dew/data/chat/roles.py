"""Role: who wrote a token of a conversation."""

from __future__ import annotations

import enum


class Role(enum.IntEnum):
    """The role of each token in ``text_roles``.

    ``NONE`` marks padding and tokens that belong to no message (for example a template's
    preamble before the first message); ``SYSTEM``, ``USER``, ``ASSISTANT`` and ``TOOL`` follow
    the chat roles. Stored as ``int8``.
    """

    NONE = 0
    SYSTEM = 1
    USER = 2
    ASSISTANT = 3
    TOOL = 4

    @classmethod
    def parse(cls, name: object, *, where: str = "role") -> Role:
        """The Role for a message's ``role`` string (``developer`` counts as ``system``)."""
        if not isinstance(name, str):
            raise TypeError(f"{where}: expected a role string, got {type(name).__name__} {name!r}")
        key = {"developer": "system", "ipython": "tool", "function": "tool"}.get(name, name)
        try:
            return cls[key.upper()]
        except KeyError:
            raise ValueError(
                f"{where}: unknown role {name!r}; expected system, user, assistant or tool"
            ) from None

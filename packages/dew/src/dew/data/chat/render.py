"""Render a conversation to token ids and give every token a role, one prefix at a time.

For a conversation ``m[0..n)``: render the first ``k`` messages for ``k = 1..n`` and tokenize
each. The tokens a prefix adds over the previous one belong to message ``k - 1`` and get its
role. For an assistant message, the prefix before it is also rendered with
``add_generation_prompt=True``; the tokens that adds (the assistant header, such as
``<|im_start|>assistant\\n``) get ``Role.NONE``, so the assistant span holds only what the
model is asked to generate: the content and the template's end-of-turn tokens.

Every shorter rendering's ids must be a prefix of the next one's; a template that rewrites
earlier tokens (for example one that drops reasoning from past turns) raises ``ValueError``
naming the conversation (``where``: the readers pass the file and line, ``chat.jsonl: line
3``) and the message. So does a template that raises (``raise_exception``) or fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import numpy as np

from dew.data.chat.roles import Role
from dew.data.chat.template import ChatTokenizer


def render_roles(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    where: str = "conversation",
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int32 [N], roles int8 [N])`` of one validated conversation.

    ``where`` starts every error message (the readers pass ``"<file>: line <n>"``).
    """
    ids: list[int] = []
    roles: list[int] = []

    def render(k: int, header: bool) -> list[int]:
        """Ids of messages up to ``k`` (``header``: before ``k``, plus the generation prompt)."""
        upto = messages[:k] if header else messages[: k + 1]
        try:
            text = tokenizer.render(upto, tools, add_generation_prompt=header)
        except jinja2.TemplateError as err:
            raise ValueError(
                f"{where}: the chat template failed at message {k} ({type(err).__name__}: {err})"
            ) from None
        return tokenizer.encode(text)

    def extend(new: list[int], role: Role, what: str) -> None:
        if new[: len(ids)] != ids:
            at = (
                next(i for i, (a, b) in enumerate(zip(ids, new)) if a != b)
                if len(new) >= len(ids)
                else len(new)
            )
            raise ValueError(
                f"{where}: rendering {what} changes earlier tokens (first "
                f"difference at token {at}); the chat template is not append-only here"
            )
        roles.extend([int(role)] * (len(new) - len(ids)))
        ids[:] = new

    for k, message in enumerate(messages):
        role = Role.parse(message["role"], where=f"{where}: message {k} role")
        if role is Role.ASSISTANT:
            extend(render(k, True), Role.NONE, f"the generation prompt before message {k}")
        extend(render(k, False), role, f"message {k}")
    return np.asarray(ids, np.int32), np.asarray(roles, np.int8)

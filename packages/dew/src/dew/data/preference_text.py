"""Tokenise preference rows in TRL's layouts into the id/mask rows ``PreferencePairs`` pads.

TRL's preference datasets hold ``prompt`` (optional), ``chosen`` and ``rejected`` in one of two
forms (TRL's dataset-formats guide, TRL 1.x):

* standard: each field a string. The ids are ``encode(prompt) + encode(chosen)`` followed by
  the tokenizer's end-of-sequence id when it has one (TRL appends it too, so the model learns
  to stop); the mask is 0 on the prompt and 1 on the completion and its end id.
* conversational: each field a list of ``{"role", "content"}`` messages. ``prompt + chosen``
  is rendered with the chat template (``dew.data.chat.render_roles``); the mask is 1 on the
  assistant tokens after the prompt (the content and the template's end-of-turn tokens, not
  the assistant header), 0 elsewhere. Without ``prompt`` (TRL's implicit prompt), the
  messages ``chosen`` and ``rejected`` share at the start are the prompt.

A row whose ``chosen`` and ``rejected`` are lists of integers is already tokenised and passes
through unchanged (with its optional ``chosen_mask``/``rejected_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_SIDES = ("chosen", "rejected")


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, Mapping) for m in value)


def row_form(row: Mapping[str, Any], where: str) -> str:
    """``"ids"``, ``"text"`` or ``"messages"``: the layout of one row (refused when mixed).

    A list that is not a list of messages counts as ids; its values are checked later.
    """
    forms: dict[str, str] = {}
    for side in _SIDES:
        value = row.get(side)
        if value is None:
            raise ValueError(f"{where}: missing field {side!r}")
        if isinstance(value, str):
            forms[side] = "text"
        elif _is_messages(value):
            forms[side] = "messages"
        elif isinstance(value, list):
            forms[side] = "ids"
        else:
            raise TypeError(
                f"{where}: {side} must be a list of token ids, a string or a list of "
                f"messages, got {type(value).__name__}"
            )
    if forms["chosen"] != forms["rejected"]:
        names = {"ids": "a list of token ids", "text": "a string", "messages": "a list of messages"}
        raise TypeError(
            f"{where}: chosen must be {names[forms['rejected']]} like rejected, got "
            f"{names[forms['chosen']]}"
        )
    return forms["chosen"]


def _eos_id(tokenizer: Any) -> int | None:
    special = getattr(tokenizer, "special", {}) or {}
    token = special.get("eos_token")
    if token is None:
        return None
    found = tokenizer.tokenizer.token_to_id(token)
    return None if found is None else int(found)


def _text_side(tokenizer: Any, prompt: str, completion: str, where: str) -> dict[str, Any]:
    prompt_ids = tokenizer.encode(prompt) if prompt else []
    completion_ids = tokenizer.encode(completion)
    eos = _eos_id(tokenizer)
    if eos is not None:
        completion_ids = completion_ids + [eos]
    if not completion_ids:
        raise ValueError(f"{where}: the completion has no tokens")
    return {
        "ids": prompt_ids + completion_ids,
        "mask": [0] * len(prompt_ids) + [1] * len(completion_ids),
    }


def _check_messages(messages: Sequence[Any], where: str) -> None:
    from dew.data.chat.messages import conversation

    conversation({"messages": list(messages)}, "messages", where)


def _message_side(
    tokenizer: Any, prompt: list[Mapping[str, Any]], completion: list[Any], where: str
) -> dict[str, Any]:
    import numpy as np

    from dew.data.chat.render import render_roles
    from dew.data.chat.roles import Role

    messages = list(prompt) + list(completion)
    _check_messages(messages, where)
    if not any(Role.parse(m["role"]) is Role.ASSISTANT for m in completion):
        raise ValueError(f"{where}: the completion has no assistant message")
    ids, roles = render_roles(tokenizer, messages, where=where)
    start = (
        len(tokenizer.encode(tokenizer.render(prompt, add_generation_prompt=True))) if prompt else 0
    )
    mask = (roles == int(Role.ASSISTANT)) & (np.arange(len(ids)) >= start)
    return {"ids": ids.tolist(), "mask": mask.astype(np.int32).tolist()}


def tokenize_row(row: Mapping[str, Any], tokenizer: Any, where: str) -> Mapping[str, Any]:
    """One row as ``{chosen, rejected, chosen_mask, rejected_mask}`` token lists."""
    if not isinstance(row, Mapping):
        raise TypeError(f"{where}: expected a JSON object, got {type(row).__name__}")
    form = row_form(row, where)
    if form == "ids":
        return row
    if not tokenizer:
        raise ValueError(
            f"{where}: chosen/rejected are {'text' if form == 'text' else 'messages'}, which "
            "needs tokenizer= (a tokenizer directory with a chat template)"
        )
    prompt = row.get("prompt")
    out: dict[str, Any] = {}
    if form == "text":
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(
                f"{where}: prompt must be a string like chosen, got {type(prompt).__name__}"
            )
        for side in _SIDES:
            side_row = _text_side(tokenizer, prompt or "", row[side], f"{where}: {side}")
            out[side], out[f"{side}_mask"] = side_row["ids"], side_row["mask"]
        return out
    chosen, rejected = list(row["chosen"]), list(row["rejected"])
    if prompt is None:  # implicit prompt: the shared leading messages
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    elif not _is_messages(prompt):
        raise TypeError(f"{where}: prompt must be a list of messages like chosen, got {prompt!r}")
    for side, messages in (("chosen", chosen), ("rejected", rejected)):
        side_row = _message_side(tokenizer, list(prompt), messages, f"{where}: {side}")
        out[side], out[f"{side}_mask"] = side_row["ids"], side_row["mask"]
    return out


__all__ = ["row_form", "tokenize_row"]

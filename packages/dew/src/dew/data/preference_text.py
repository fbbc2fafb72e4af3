"""Tokenise preference rows in TRL's layouts into the id/mask rows ``PreferencePairs`` pads.

TRL's preference datasets hold ``prompt`` (optional), ``chosen`` and ``rejected`` in one of two
forms (TRL's dataset-formats guide, TRL 1.x). Both are tokenised as TRL 1.16's
``DPOTrainer`` prepares them, token for token (``tests/parity/test_dpo_token_parity.py``):

* standard: each field a string. The tokenizer's EOS text is appended to each completion that
  does not already end with it; ``prompt + completion`` is tokenised as one text with the
  tokenizer's own special tokens (a BOS first, for tokenizers whose post-processor adds one),
  and so is the prompt alone. The completion starts where the prompt's ids stop agreeing with
  the ids of either side (a prompt ending in a space or inside a word shares its last token
  with the completion, so that token counts as completion); the mask is 0 before that point
  and 1 from it, EOS included. Without ``prompt`` (TRL's implicit prompt), the characters the
  two texts start with are the prompt, less a trailing space (``implicit_text_prompt``).
* conversational: each field a list of ``{"role", "content"}`` messages. ``prompt + chosen``
  is rendered with the chat template (``dew.data.chat.render_roles``); the mask is 1 on the
  assistant tokens after the prompt (the content and the template's end-of-turn tokens, not
  the assistant header), 0 elsewhere. Without ``prompt`` (TRL's implicit prompt), the
  messages ``chosen`` and ``rejected`` share at the start are the prompt. For a completion of
  one assistant message this is TRL's mask. A completion of several messages differs by
  design: TRL trains on everything after the prompt, Dew only on the assistant messages (a
  user or tool turn inside the completion, and the next assistant header, stay 0).

Dew never truncates: a row longer than ``PreferencePairs``' ``seq_len`` is refused, where
TRL's ``max_length`` would cut it.

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


def common_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    """How many leading ids ``ids`` and ``other`` share (0 when either is empty).

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    length = 0
    for token, other_token in zip(ids, other):
        if token != other_token:
            break
        length += 1
    return length


def implicit_text_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """``(prompt, chosen, rejected)`` of two texts without a prompt field, as TRL splits them.

    The prompt is the characters both texts start with, less the last one when it is a space
    (so the completions keep their leading space). When one text is a prefix of the other,
    the last shared character starts the completions (TRL's loop stops one short there).
    Texts that differ from their first character have an empty prompt.
    """
    shared = min(len(chosen), len(rejected))
    index = next((i for i in range(shared) if chosen[i] != rejected[i]), None)
    if index is None:
        index = max(shared - 1, 0)
    elif index > 0 and chosen[index - 1] == " ":
        index -= 1
    return chosen[:index], chosen[index:], rejected[index:]


def _text_pair(tokenizer: Any, prompt: str, row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Both sides of a text row: ids of ``prompt + completion + EOS`` and their masks."""
    eos = (getattr(tokenizer, "special", {}) or {}).get("eos_token")
    full = {}
    for side in _SIDES:
        completion = row[side]
        if eos and not completion.endswith(eos):
            completion += eos
        full[side] = tokenizer.encode(prompt + completion, add_special_tokens=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
    start = min(common_prefix(prompt_ids, full[side]) for side in _SIDES)
    out: dict[str, Any] = {}
    for side in _SIDES:
        if len(full[side]) <= start:
            raise ValueError(f"{where}: {side}: the completion has no tokens")
        out[side] = full[side]
        out[f"{side}_mask"] = [0] * start + [1] * (len(full[side]) - start)
    return out


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
    if form == "text":
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(
                f"{where}: prompt must be a string like chosen, got {type(prompt).__name__}"
            )
        if prompt is None:  # implicit prompt: the text chosen and rejected start with
            prompt, chosen_text, rejected_text = implicit_text_prompt(
                row["chosen"], row["rejected"]
            )
            row = {"chosen": chosen_text, "rejected": rejected_text}
        return _text_pair(tokenizer, prompt, row, where)
    out: dict[str, Any] = {}
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


__all__ = ["common_prefix", "implicit_text_prompt", "row_form", "tokenize_row"]

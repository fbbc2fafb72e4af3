"""What the ``data`` section of a ``dew train`` config reads: the rows of each kind, the
vocabulary they need and the row width the model must cover.

``read_data(config)`` returns ``(data, vocab, width)``: the loaded ``Dataset`` (with its
validation split when one is configured), the vocabulary size (the model's, the tokenizer's
or the largest id plus one) and the row width ``W`` the objective trains. Every row is read
and checked, so a bad file fails before the first step with an error naming its key.
"""

from __future__ import annotations

import os
from typing import Any

from dew.recipes.references import load_reward
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import TrainConfig


def _max_id(array: Any) -> int:
    import numpy as np

    return int(np.max(array)) if np.size(array) else -1


def check_token_ids(path: str, dtype: str, vocab: int | None, where: str) -> int:
    """Read every id of the token file ``path`` and return the vocabulary it needs:
    ``vocab``, or the largest id plus one when ``vocab`` is None.

    Raises:
      ConfigError: an empty file, a negative id, or an id ``>= vocab``; named ``where``.
    """
    import numpy as np

    from dew.data.tokens import open_tokens

    ids = open_tokens(path, dtype)
    if ids.size == 0:
        raise ConfigError(f"{where}: {path!r} holds no tokens")
    if np.issubdtype(ids.dtype, np.signedinteger):
        negative = np.flatnonzero(ids < 0)
        if negative.size:
            at = int(negative[0])
            raise ConfigError(
                f"{where}: {path!r} holds a negative token id {int(ids[at])} at "
                f"position {at}; expected ids >= 0"
            )
    largest = _max_id(ids)
    vocab = vocab or largest + 1
    if largest >= vocab:
        at = int(np.flatnonzero(ids >= vocab)[0])
        raise ConfigError(
            f"{where}: {path!r} holds id {int(ids[at])} at position {at}, outside "
            f"model.vocab_size {vocab}"
        )
    return vocab


def token_count(config: TrainConfig) -> int:
    """The largest id of ``data.tokens`` and ``data.val_tokens`` plus one."""
    d = config.data
    count = check_token_ids(d.tokens, d.token_dtype, None, "data.tokens")
    if d.val_tokens is not None:
        count = max(count, check_token_ids(d.val_tokens, d.token_dtype, None, "data.val_tokens"))
    return count


def _lm_data(config: TrainConfig) -> tuple[Any, int, int]:
    from dew.data import TokenFile

    d = config.data
    vocab = check_token_ids(d.tokens, d.token_dtype, config.model.vocab_size, "data.tokens")
    spec = TokenFile(d.tokens, d.seq_len, dtype=d.token_dtype, eos_id=d.eos_id,
                     seed=config.run.seed, val_path=d.val_tokens, val_batches=d.val_batches)  # fmt: skip
    return spec.load(batch=config.run.batch), vocab, d.seq_len + 1


def _sft_data(config: TrainConfig) -> tuple[Any, int, int]:
    from dew.data.chat import ChatMessages, Role
    from dew.data.chat.messages import conversation, read_labeled_rows

    d = config.data
    spec = ChatMessages(d.path, d.tokenizer, d.seq_len, column=d.column, val_path=d.val_path,
                        seed=config.run.seed)  # fmt: skip
    tokenizer = spec.chat_tokenizer()
    if not config.objective.all_tokens:
        name, rows, labels = read_labeled_rows(d.path, spec.split, spec.options)
        for index, raw in enumerate(rows):
            where = f"{name}: {labels[index]}"
            messages, _ = conversation(raw, d.column, where)
            if not any(Role.parse(m["role"]) is Role.ASSISTANT for m in messages):
                raise ConfigError(
                    f"{where}: the conversation has no assistant turn, "
                    "and SFT counts only assistant tokens (pass --all-tokens to count every token)"
                )
    return spec.load(config.run.batch), tokenizer.tokenizer.get_vocab_size(), d.seq_len + 1


def _train_and_val(loader: Any, config: TrainConfig, **options: Any) -> tuple[Any, Any]:
    """``loader`` over ``data.path`` and, when set, ``data.val_path`` (else None), each with
    the run's seed and, when set, ``data.tokenizer``."""
    d = config.data
    options["seed"] = config.run.seed
    if d.tokenizer is not None:
        options["tokenizer"] = d.tokenizer
    return loader(d.path, **options), (loader(d.val_path, **options) if d.val_path else None)


def _dpo_data(config: TrainConfig) -> tuple[Any, int, int]:
    from dew.data.preference import PreferencePairs

    d = config.data
    pairs, val = _train_and_val(PreferencePairs, config, seq_len=d.seq_len)
    vocab = _vocab(config, pairs, _max_id(pairs.arrays["input_ids"]))
    return pairs.load(config.run.batch, val=val), vocab, d.seq_len


def _grpo_data(config: TrainConfig) -> tuple[Any, int, int]:
    from dew.data.prompts import Prompts

    d = config.data
    prompts, val = _train_and_val(Prompts, config, max_prompt_len=d.max_prompt_len)
    needs = getattr(reward_object(config.objective.reward), "needs", ())
    reader = f"objective.reward {config.objective.reward!r}"
    for key, reader_data in (("data.path", prompts), ("data.val_path", val)):
        if reader_data is not None:
            try:
                reader_data.check_fields(needs, key, reader)
            except ValueError as err:
                raise ConfigError(str(err)) from None
    largest = _max_id(prompts.arrays["prompt"])
    if d.tokenizer is None and config.model.vocab_size is None and config.model.pretrained is None:
        raise ConfigError(
            f"model.vocab_size: required for {config.kind.upper()} on token-id prompts without "
            "data.tokenizer "
            f"(the prompts' largest id is {largest})"
        )
    vocab = _vocab(config, prompts, largest)
    width = d.max_prompt_len + config.objective.max_new_tokens
    return prompts.load(config.run.batch, val=val), vocab, width


def generation_room(config: TrainConfig) -> int:
    """The positions sampling uses: ``dew.inference`` pads the context and the response budget
    each to a power of two (at least 16), so the model must cover their sum."""
    from dew.inference.compiled import bucket

    return bucket(config.data.max_prompt_len) + bucket(config.objective.max_new_tokens)


def _vocab(config: TrainConfig, reader: Any, largest: int) -> int:
    vocab = config.model.vocab_size
    if vocab is None and config.data.tokenizer is not None:
        from dew.data.chat.template import load_chat_tokenizer

        vocab = load_chat_tokenizer(
            config.data.tokenizer, "data.tokenizer"
        ).tokenizer.get_vocab_size()
    vocab = vocab or largest + 1
    if largest >= vocab:
        raise ConfigError(
            f"data.path: {config.data.path!r} holds token id {largest}, outside the vocabulary "
            f"of {vocab}"
        )
    return vocab


def on_path() -> None:
    """The working directory on ``sys.path``: ``--reward my_rewards:f`` finds ./my_rewards.py."""
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def reward_object(spec: str) -> Any:
    """What ``objective.reward`` names (a class or a function), not yet instantiated."""
    on_path()
    return load_reward(spec, "objective.reward")


def read_data(config: TrainConfig) -> tuple[Any, int, int]:
    """The rows of ``config.data`` as its kind reads them, the vocabulary size and the row
    width (see the module docstring)."""
    readers = {"lm": _lm_data, "sft": _sft_data, "dpo": _dpo_data, "grpo": _grpo_data,
               "ppo": _grpo_data}  # fmt: skip
    return readers[config.kind](config)


__all__ = ["generation_room", "on_path", "read_data", "reward_object", "token_count"]

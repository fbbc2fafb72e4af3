"""ChatTokenizer: a ``tokenizers`` tokenizer plus its Jinja chat template, without transformers.

A Hugging Face tokenizer directory holds ``tokenizer.json`` (the ``tokenizers`` pipeline) and
``tokenizer_config.json`` (``chat_template``, special tokens). ``ChatTokenizer.load(dir)``
reads both. ``render`` fills the template the way transformers does for
``apply_chat_template`` (Jinja with ``trim_blocks`` and ``lstrip_blocks``, the loop-control
extension, a ``tojson`` filter that keeps non-ASCII text, ``raise_exception`` and
``strftime_now``; ``{% generation %}`` blocks render their body), and ``encode`` tokenizes the
rendered text without adding special tokens, as ``apply_chat_template`` does, since the
template writes them itself.

Checked against transformers 5.10's ``apply_chat_template`` by ``tools/parity_chat.py``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: render the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    """A tokenizer with a chat template.

    Args:
      tokenizer: a ``tokenizers.Tokenizer``.
      chat_template: the Jinja source.
      special: special token strings passed to the template (``bos_token``, ``eos_token`` ...).
    """

    def __init__(
        self, tokenizer: Any, chat_template: str, special: Mapping[str, str] | None = None
    ):
        if not isinstance(chat_template, str) or not chat_template:
            raise ValueError("chat_template: the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = dict(special or {})
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_Generation, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(chat_template)
        pad = self.special.get("pad_token")
        self.pad_id = self.tokenizer.token_to_id(pad) if pad else None

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChatTokenizer:
        """Read ``tokenizer.json`` and ``tokenizer_config.json`` from a local directory."""
        from tokenizers import Tokenizer

        directory = os.fspath(directory)
        tok_path = os.path.join(directory, "tokenizer.json")
        cfg_path = os.path.join(directory, "tokenizer_config.json")
        for path in (tok_path, cfg_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"tokenizer: {path!r} not found")
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
        template = config.get("chat_template")
        jinja_path = os.path.join(directory, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        if not isinstance(template, str):
            raise ValueError(f"tokenizer {directory!r}: tokenizer_config.json has no chat_template")
        special = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            text = _token_text(config.get(name))
            if text is not None:
                special[name] = text
        return cls(Tokenizer.from_file(tok_path), template, special)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        """The template's text for ``messages``."""
        return self._template.render(
            messages=list(messages),
            tools=None if tools is None else list(tools),
            add_generation_prompt=add_generation_prompt,
            **self.special,
            **kwargs,
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; by default no special tokens are added (rendered text holds
        its own). ``add_special_tokens=True`` applies the tokenizer's post-processor (a BOS
        first, for tokenizers that add one), as calling a transformers tokenizer on text does.
        """
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def prompt_ids(tokenizer: ChatTokenizer, question: str) -> list[int]:
    """The ids of one user ``question`` rendered by ``tokenizer``'s template and followed by
    the assistant generation prompt: what a policy reads before it answers (``[P]`` ids, no
    padding)."""
    messages = [{"role": "user", "content": question}]
    return tokenizer.encode(tokenizer.render(messages, add_generation_prompt=True))


#: What a tokenizer directory holds that loaders read (``tokenizers``, ``transformers``, Dew).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def local_or_hub_directory(
    name: str | os.PathLike[str],
    field: str,
    kind: str,
    patterns: Sequence[str],
    lookup_failed: str = "; looked up as a Hub name, it failed too",
) -> str:
    """``name`` when it is a local directory, else the Hugging Face snapshot of the files
    matching ``patterns`` for a name that could be a Hub id. Errors name ``field``: a file
    (``ValueError``, "expected a ``kind`` directory"), a missing directory
    (``FileNotFoundError``; ``lookup_failed`` and the Hub's reason follow for Hub-like names).
    """
    path = os.fspath(name)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise ValueError(f"{field}: {path!r} is a file; expected a {kind} directory")
    if not looks_like_hub_id(path):
        raise FileNotFoundError(f"{field}: no such directory {path!r}")
    try:
        from huggingface_hub import snapshot_download  # type: ignore[import-not-found]
    except ImportError as err:
        raise ImportError(
            f"{field}: no such directory {path!r}; as a Hub name it needs the optional "
            "'hf' extra (pip install 'dew[hf]')"
        ) from err
    try:
        local: str = snapshot_download(path, allow_patterns=list(patterns))
    except Exception as err:  # offline, unknown repo, no network: one line that says so
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise FileNotFoundError(
            f"{field}: no such directory {path!r}{lookup_failed} ({type(err).__name__}: {reason})"
        ) from None
    return local


def tokenizer_directory(name: str | os.PathLike[str], field: str = "tokenizer") -> str:
    """The local directory of a tokenizer: ``name`` itself, or the Hub snapshot of the files
    in ``TOKENIZER_FILES`` (the ``hf`` extra); see ``local_or_hub_directory``."""
    return local_or_hub_directory(name, field, "tokenizer", TOKENIZER_FILES)


def load_chat_tokenizer(name: str | os.PathLike[str], field: str = "tokenizer") -> ChatTokenizer:
    """A ``ChatTokenizer`` from a local directory, or from a Hub name with the ``hf`` extra
    (see ``tokenizer_directory``)."""
    return ChatTokenizer.load(tokenizer_directory(name, field))


def copy_tokenizer(name: str | os.PathLike[str], target: str | os.PathLike[str]) -> list[str]:
    """Copy the tokenizer files of ``name`` (a directory or Hub name) into ``target``, each
    written atomically; returns the names copied."""
    from dew.files import atomic_write

    source = tokenizer_directory(name, "tokenizer")
    os.makedirs(target, exist_ok=True)
    copied = []
    for file in TOKENIZER_FILES:
        path = os.path.join(source, file)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                data = f.read()
            with atomic_write(os.path.join(target, file), "wb") as out:
                out.write(data)
            copied.append(file)
    return copied


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` could be a Hub repository id (``name`` or ``org/name``), rather than
    only a path: no leading ``.``, ``/`` or ``~``, at most one slash, no ``..``."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name

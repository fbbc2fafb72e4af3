"""Typed config sections: read a mapping into a dataclass, refusing unknown keys by name.

A config (from YAML, JSON or the command line) is a tree of mappings. Each section is a
frozen dataclass whose fields are the section's keys; ``section(cls, mapping, where)`` checks
every key and value and returns the dataclass. Every error is a ``ConfigError`` whose message
starts with the key's dotted path (``optimizer.learning_rate``) or the file it came from, says
what was expected and what came, and for an unknown key names the nearest valid one.

``load_file(path)`` reads a ``.json``, ``.yaml`` or ``.yml`` file into a mapping (errors name
the file and line); ``apply_override(config, "a.b=value")`` sets one nested key, the value
parsed as YAML (``1e-5`` is a float, ``true`` a bool, ``null`` None, anything else a string).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from dew.checks import is_int, is_real

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value is wrong; the message names where, what was expected and what came."""


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name closest to ``name`` (None when nothing is close)."""
    found = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def unknown_key(where: str, key: str, choices: Iterable[str]) -> ConfigError:
    """The error for ``key`` not being one of ``choices`` under ``where``."""
    choices = sorted(choices)
    near = nearest(key, choices)
    hint = f"did you mean {near!r}? " if near else ""
    path = f"{where}.{key}" if where else key
    return ConfigError(f"{path}: unknown key; {hint}valid keys: {', '.join(choices)}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is tuple:  # a fixed-length tuple, written as a list in a config
        return "[" + ", ".join(_type_name(t) for t in typing.get_args(tp)) + "]"
    return getattr(tp, "__name__", str(tp))


def check_value(value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to the annotated type ``tp`` (int, float, str, bool, optional, or a
    fixed-length ``tuple[...]``, which a JSON or YAML config spells as a list of as many
    items: ``[0.5, 2.0]`` for ``tuple[float, float]`` gives ``(0.5, 2.0)``)."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        items = typing.get_args(tp)
        if not isinstance(value, list | tuple) or len(value) != len(items):
            raise ConfigError(
                f"{where}: expected a list of {len(items)} ({_type_name(tp)}), got {value!r}"
            )
        return tuple(
            check_value(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, items))
        )
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return check_value(value, option, where)
            except ConfigError as err:
                errors.append(err)
        names = " or ".join(_type_name(o) if o is not type(None) else "null" for o in options)
        raise ConfigError(f"{where}: expected {names}, got {value!r}")
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(
                f"{where}: expected one of {', '.join(map(str, allowed))}, got {value!r}"
            )
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if not is_int(value):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads ``1e-5`` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if not is_real(value):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Any:
        return value
    raise TypeError(f"{where}: unsupported config annotation {tp!r}")  # pragma: no cover


def section(cls: type[T], mapping: Any, where: str) -> T:
    """Read ``mapping`` into the dataclass ``cls``; fields without a default are required."""
    if isinstance(mapping, cls):
        return mapping
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {mapping!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in fields:
            raise unknown_key(where, str(key), fields)
        values[key] = check_value(value, hints[key], f"{where}.{key}" if where else key)
    for name, field in fields.items():
        required = (
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        )
        if required and name not in values:
            raise ConfigError(f"{where}.{name}: required, missing")
    try:
        return cls(**values)
    except ConfigError as err:
        # the dataclass names its own section ("optimizer.clip"); say where it sits
        text = str(err)
        head, dot, rest = text.partition(".")
        if where and dot and not text.startswith(where) and " " not in head:
            raise ConfigError(f"{where}.{rest}") from None
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {err}") from None


def positive(value: Any, where: str, *, allow_zero: bool = False) -> None:
    """Refuse a number below zero (or at zero unless ``allow_zero``)."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        want = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where}: expected a finite number {want}, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        want = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where}: expected a number {want}, got {value!r}")


def directory_path(path: str | os.PathLike[str], where: str) -> None:
    """Refuse a directory path that is a file, or that lies under a file (``where`` names
    the key). A path that does not exist yet is fine: it is made when first written."""
    text = os.fspath(path)
    if os.path.exists(text) and not os.path.isdir(text):
        raise ConfigError(f"{where}: {text!r} is a file; expected a directory")
    parent = os.path.dirname(os.path.abspath(text))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise ConfigError(f"{where}: {text!r} lies under the file {parent!r}; expected a directory")


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config mapping from a ``.json``, ``.yaml`` or ``.yml`` file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err)
            raise ConfigError(f"{path}:{line}: malformed YAML ({problem})") from None
    elif path.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: line {err.lineno}: malformed JSON ({err.msg})") from None
    else:
        raise ConfigError(f"{path}: expected a .json, .yaml or .yml config file")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys at the top, got {type(data).__name__}"
        )
    return data


def parse_value(text: str) -> Any:
    """A command-line value read as YAML: numbers, booleans and null typed, else the string."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads ``1e-5`` (no dot) as a string
        except ValueError:
            return value
    return text if value is None and text.strip().lower() not in ("null", "~", "none") else value


def apply_override(config: dict[str, Any], assignment: str, flag: str = "--set") -> None:
    """Set ``a.b.c=value`` in ``config`` (creating sections); the value is read by ``parse_value``."""
    if "=" not in assignment:
        raise ConfigError(f"{flag} {assignment!r}: expected KEY.PATH=VALUE")
    path, text = assignment.split("=", 1)
    keys = path.strip().split(".")
    if not all(keys):
        raise ConfigError(
            f"{flag} {assignment!r}: expected a dotted key like optimizer.learning_rate"
        )
    node = config
    for i, key in enumerate(keys[:-1]):
        if key.isdigit() and isinstance(node, list):
            index = int(key)
            if index >= len(node):
                raise ConfigError(
                    f"{flag} {assignment!r}: {'.'.join(keys[: i + 1])} is past the end "
                    f"({len(node)} entries)"
                )
            node = node[index]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{flag} {assignment!r}: {'.'.join(keys[:i])} is not a section")
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        node = child
    if isinstance(node, list) and keys[-1].isdigit():
        node[int(keys[-1])] = parse_value(text)
    elif isinstance(node, dict):
        node[keys[-1]] = parse_value(text)
    else:
        raise ConfigError(f"{flag} {assignment!r}: {'.'.join(keys[:-1])} is not a section")


__all__ = [
    "ConfigError",
    "apply_override",
    "check_value",
    "load_file",
    "nearest",
    "parse_value",
    "positive",
    "section",
    "unknown_key",
]

"""YAML into typed config dataclasses (train/config.py): sections read from a file, ``key=value`` overrides applied,
every value converted to its field's type or refused with one line naming the key, the value and the type expected
(``override train.batch_size=abc: expected an int``); unknown keys refused with the known ones listed."""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mia_jax.errors import UserError


class _Mismatch(Exception):
    """A value that does not fit its field's type: args = (dotted key, value, what was expected)."""


def _show(value) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(text: str):
    """An int or float from a number's text (YAML 1.1 reads 1e-5, without a dot, as a string), else the text."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def _coerce(value, typ, key: str):
    """``value`` as the field type ``typ``: int, float, bool, str, list[...] or X | None (null).

    An int takes integral numbers only (1e5 yes, 1.5 no); a float takes any finite number, also written as text
    ("1e-5"); a bool takes true / false (YAML's yes / no / on / off too, as YAML reads them); a str takes text,
    or an integer as its digits. Raises _Mismatch."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        try:
            return _coerce(value, inner, key)
        except _Mismatch as m:
            raise (_Mismatch(key, value, f"{m.args[2]} or null") if m.args[0] == key else m) from None
    if origin is list:
        if not isinstance(value, list):
            raise _Mismatch(key, value, "a list in brackets, e.g. [a, b]")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    expected = {int: "an int", float: "a float", bool: "true or false", str: "a string (quote it)"}[typ]
    if isinstance(value, str) and typ in (int, float):
        value = _number(value.strip())
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif isinstance(value, bool):  # True is an int to Python, not to a config
        pass
    elif typ is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif typ is float:
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                return float(value)
            expected = "a finite float"
    elif typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int):
            return str(value)
    raise _Mismatch(key, value, expected)


def _mismatch(head: str, m: _Mismatch, whole: str | None = None) -> UserError:
    key, value, expected = m.args
    if key == whole:  # the override's own value: "override train.batch_size=abc: expected an int"
        return UserError(f"{head}expected {expected}")
    return UserError(f"{head}{key} is {_show(value)}, expected {expected}")


def _unknown(head: str, key: str, section: str, known: Sequence[str]) -> UserError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean {(section + '.' if section else '') + close[0]!r}?)" if close else ""
    where = f"in {section}" if section else "at the top level"
    return UserError(f"{head}unknown key {key!r}{hint}; known {where}: {', '.join(known)}")


def build(cls, data: Any, prefix: str, head: str):
    """A dataclass instance from a (nested) mapping, each value converted to its field's type; unknown keys and
    mistyped values are refused with a message that starts with ``head`` and names the dotted key."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise UserError(f"{head}{prefix or 'the top level'} is {_show(data)}, expected a mapping (a section)")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in hints:
            raise _unknown(head, key, prefix, known)
        if dataclasses.is_dataclass(hints[name]):
            kwargs[name] = build(hints[name], value, key, head)
            continue
        try:
            kwargs[name] = _coerce(value, hints[name], key)
        except _Mismatch as m:
            raise _mismatch(head, m) from None
    return cls(**kwargs)


def _yaml_problem(e: yaml.YAMLError, lines: bool = True) -> str:
    """A YAML error on one line: its problem and where."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or (str(e).strip().splitlines() or ["unreadable"])[0]
    if mark is None:
        return problem
    return f"{problem} at {f'line {mark.line + 1}, ' if lines else ''}column {mark.column + 1}"


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"override {item!r} must look like section.key=value (e.g. train.lr=1e-5)")
    try:
        return key, (yaml.safe_load(text) if text else "")
    except yaml.YAMLError as e:
        raise UserError(f"override {item}: the value is not valid YAML ({_yaml_problem(e, lines=False)})") from None


def apply_override(cfg, item: str) -> None:
    """Set the field named by the override ``item`` (``a.b=value``), converting the value to the field's type.
    A section given a mapping (``corpus.news={n_positives: 5}``) changes only the keys it names."""
    key, value = _parse_override(item)
    head = f"override {item}: "
    *path, last = key.split(".")
    node = cfg
    for i, part in enumerate(path + [last]):
        section = ".".join(path[:i])
        if not dataclasses.is_dataclass(node):
            raise UserError(f"{head}{section} is not a section")
        known = [f.name for f in dataclasses.fields(node)]
        if part not in known:
            raise _unknown(head, ".".join(path[:i] + [part]), section, known)
        if i < len(path):
            node = getattr(node, part)
    current = getattr(node, last)
    if dataclasses.is_dataclass(current):
        if not isinstance(value, dict):
            first = dataclasses.fields(current)[0].name
            raise UserError(f"{head}{key} is a section: set its keys (e.g. {key}.{first}=...) or give a mapping "
                            f"({key}={{{first}: ...}})")
        value = build(type(current), _merge(dataclasses.asdict(current), value), key, head)
    else:
        try:
            value = _coerce(value, typing.get_type_hints(type(node))[last], key)
        except _Mismatch as m:
            raise _mismatch(head, m, whole=key) from None
    setattr(node, last, value)


def _merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_sections(path: str | Path | None) -> tuple[Any, str]:
    """(the mapping of sections in the YAML file ``path``, the message head naming it): ({}, "") for no file; a
    UserError (one line) for a missing, unreadable, non-UTF-8 or invalid file, or one that is not a mapping."""
    data: Any = {}
    head = ""
    if path is not None:
        path = Path(path)
        head = f"config {path}: "
        try:
            text = path.read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise UserError(f"config {path} is a folder; give a YAML file") from None
        except OSError as e:
            raise UserError(f"cannot read config {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise UserError(f"config {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at file offset "
                            f"{e.start}); re-save it as UTF-8") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UserError(f"config {path} is not valid YAML ({_yaml_problem(e)})") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"{head}expected a mapping of sections (model:, corpus:, train:, ...) at the top level, "
                            f"got {_show(data)}")
    return data, head

"""The config file and ``key=value`` overrides, validated by pydantic into the config's dataclasses (train/config.py).

pydantic converts and checks every value; this module reads the YAML file, applies the dotted overrides to the
config's mapping, and turns pydantic's first error into one line: the file or the override, the dotted key, the value
and what is expected (``override train.batch_size=abc: expected an int``), or for an unknown key the closest known
one (``unknown key 'train.lrr' (did you mean 'train.lr'?); known in train: ...``). YAML is read with YAML 1.2's
numbers (``1e-5`` and ``1e5`` are floats; PyYAML alone reads them as text)."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from mia_jax.errors import UserError

# pydantic's error types -> what the message says is expected (a Literal's choices come with its error)
EXPECTED = {"int_type": "an int", "int_parsing": "an int", "int_from_float": "an int", "float_type": "a float",
            "float_parsing": "a float", "finite_number": "a finite float", "bool_type": "true or false",
            "bool_parsing": "true or false", "string_type": "a string (quote it)",
            "list_type": "a list in brackets, e.g. [a, b]", "dataclass_type": "a mapping (a section)"}
UNKNOWN = ("unexpected_keyword_argument", "invalid_key")


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's numbers: PyYAML (YAML 1.1) reads ``1e-5`` and ``1e5``, without a dot, as text."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))


def _show(value) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dotted(loc: tuple, unknown: bool) -> str:
    """pydantic's location as the config names it: ``score.k[1]``; the last part of an unknown key is a name."""
    key = ""
    for i, part in enumerate(loc):
        index = isinstance(part, int) and not (unknown and i == len(loc) - 1)
        key += f"[{part}]" if index else f".{part}" if key else str(part)
    return key


def _section(cls, names: list) -> type:
    """The dataclass of the section that ``names`` (field names from the top) lead to."""
    for name in names:
        cls = typing.get_type_hints(cls)[name]
    return cls


def _message(cls, err: dict, head: str, whole: str | None) -> UserError:
    """One line for pydantic's error ``err`` in validating ``cls``; ``whole``: the key of an override (whose own
    value the message does not repeat)."""
    loc, unknown = err["loc"], err["type"] in UNKNOWN
    key = _dotted(loc, unknown)
    if unknown:
        section = ".".join(str(p) for p in loc[:-1])
        known = [f.name for f in dataclasses.fields(_section(cls, list(loc[:-1])))]
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean {(section + '.' if section else '') + close[0]!r}?)" if close else ""
        where = f"in {section}" if section else "at the top level"
        return UserError(f"{head}unknown key {key!r}{hint}; known {where}: {', '.join(known)}")
    expected = err.get("ctx", {}).get("expected") if err["type"] == "literal_error" else EXPECTED.get(err["type"])
    if expected is None:
        expected = err["msg"][0].lower() + err["msg"][1:]
    if isinstance(loc[-1], str) and type(None) in typing.get_args(typing.get_type_hints(_section(cls, loc[:-1]))
                                                                  [loc[-1]]):
        expected += " or null"
    if key == whole:  # the override's own value: "override train.batch_size=abc: expected an int"
        return UserError(f"{head}expected {expected}")
    return UserError(f"{head}{key} is {_show(err['input'])}, expected {expected}")


@functools.cache
def _adapter(cls) -> TypeAdapter:
    return TypeAdapter(cls)


def validated(cls, data: Any, head: str, whole: str | None = None):
    """``data`` (nested mappings) as the pydantic dataclass ``cls``; pydantic's first error as a UserError of one
    line starting with ``head`` (``whole``: the dotted key of the override being applied)."""
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as e:
        raise _message(cls, e.errors()[0], head, whole) from None


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
        return key, (yaml.load(text, Loader=_Loader) if text else "")
    except yaml.YAMLError as e:
        raise UserError(f"override {item}: the value is not valid YAML ({_yaml_problem(e, lines=False)})") from None


def _merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_override(cfg, item: str):
    """``cfg`` (a pydantic dataclass) with the override ``item`` (``a.b=value``) applied, validated anew. A section
    given a mapping (``corpus.news={n_positives: 5}``) changes only the keys it names."""
    key, value = _parse_override(item)
    head = f"override {item}: "
    data = dataclasses.asdict(cfg)
    *path, last = key.split(".")
    node = data
    for i, part in enumerate(path):
        node = node.setdefault(part, {})  # a name that is not in the config: pydantic refuses it, with its suggestion
        if not isinstance(node, dict):
            raise UserError(f"{head}{'.'.join(path[:i + 1])} is not a section")
    if isinstance(node.get(last), dict):
        if not isinstance(value, dict):
            first = next(iter(node[last]))
            raise UserError(f"{head}{key} is a section: set its keys (e.g. {key}.{first}=...) or give a mapping "
                            f"({key}={{{first}: ...}})")
        value = _merge(node[last], value)
    node[last] = value
    return validated(type(cfg), data, head, whole=key)


def read_sections(path: str | Path | None) -> tuple[Any, str]:
    """(the mapping of sections in the YAML file ``path``, the message head naming it): ({}, "") for no file; a
    UserError (one line) for a missing, unreadable, non-UTF-8 or invalid file, or one that is not a mapping."""
    if path is None:
        return {}, ""
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
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise UserError(f"config {path} is not valid YAML ({_yaml_problem(e)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{head}expected a mapping of sections (model:, corpus:, train:, ...) at the top level, "
                        f"got {_show(data)}")
    return data, head

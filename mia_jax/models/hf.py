"""Hugging Face model folders: config.json, (sharded) safetensors, tokenizer.json, tokenizer_config.json."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from mia_jax.errors import UserError
from mia_jax.models.tensors import Lazy


def one_line(e: Exception) -> str:
    """The first line of an exception's message (for a one-line UserError)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def read_json(path: Path) -> dict:
    """A JSON object file (config.json, tokenizer_config.json, a shard index), read as UTF-8."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at file offset {e.start}); "
                        "re-download it or pass another model folder") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or one_line(e)}); re-download it or pass another "
                        "model folder") from None
    if not text.strip():
        raise UserError(f"{path}: the file is empty, expected a JSON object; re-download it or pass another model "
                        "folder")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: cannot read it as JSON ({one_line(e)}); re-download it or pass another "
                        "model folder") from e
    if not isinstance(data, dict):
        found = {list: "a list", str: "a string", bool: "true/false", int: "a number", float: "a number"}.get(
            type(data), "null")
        raise UserError(f"{path}: expected a JSON object, found {found}; re-download it or pass another model folder")
    return data


# ----------------------------------------------------------------------------- config values
#
# What each config.json value a family reads must be. The fields of a family's config dataclass carry Hugging Face
# names: their annotations say the type (int, float, bool, str; null allowed or not) and `_field_kind` the range
# (sizes positive, eps >= 0, ...). Keys a family reads that are no field (GPT-2's aliases, rotary settings, switches)
# are listed in `_EXTRA_KEYS`, the keys of a rope_scaling / rope_parameters object in `_ROPE_KEYS`. A missing
# required key is reported by `parse_config`. A new family needs nothing here unless it reads a key that is no field.

_POSITIVE_INT, _NONNEG_INT, _TOKEN_ID = "a positive integer", "an integer >= 0", "a token id (an integer)"
_POSITIVE, _NONNEG, _FRACTION = "a positive number", "a number >= 0", "a number in (0, 1]"
_BOOL, _STR, _OBJECT, _STR_LIST = "true or false", "a string", "a JSON object", "a list of strings"
_TOKEN_IDS = f"{_TOKEN_ID}, a list of token ids or null"

_EXTRA_KEYS = {
    "n_embd": _POSITIVE_INT, "n_layer": _POSITIVE_INT, "n_head": _POSITIVE_INT, "n_positions": _POSITIVE_INT,
    "n_inner": _POSITIVE_INT, "max_window_layers": _NONNEG_INT, "sliding_window_pattern": _POSITIVE_INT,
    "rotary_pct": _FRACTION, "partial_rotary_factor": _FRACTION, "rotary_emb_base": _POSITIVE, "rope_theta": _POSITIVE,
    "use_sliding_window": _BOOL, "_remove_final_layer_norm": _BOOL, "hidden_act": _STR, "hidden_activation": _STR,
    "layer_norm_eps": _NONNEG, "rms_norm_eps": _NONNEG, "layer_norm_epsilon": _NONNEG,
    "rope_scaling": _OBJECT, "rope_parameters": _OBJECT, "layer_types": _STR_LIST, "model_type": _STR,
}
# keys of `_EXTRA_KEYS` that may be null (a field may be null where its annotation allows None)
_NULLABLE = {"n_embd", "n_layer", "n_head", "n_positions", "n_inner", "rope_scaling", "rope_parameters", "layer_types",
             "hidden_activation"}
_ROPE_KEYS = {"rope_theta": _POSITIVE, "factor": _POSITIVE, "low_freq_factor": _POSITIVE,
              "high_freq_factor": _POSITIVE, "original_max_position_embeddings": _POSITIVE_INT,
              "partial_rotary_factor": _FRACTION, "rope_type": _STR, "type": _STR}


def _number_kind(name: str) -> str:
    """The range of a float field: eps >= 0, a rotary fraction in (0, 1], anything else positive."""
    if "eps" in name:
        return _NONNEG
    return _FRACTION if name in ("rotary_pct", "partial_rotary_factor") else _POSITIVE


def _field_kind(name: str, annotation: str) -> str | None:
    """What a config dataclass field must hold, from its name and its annotation (a string: the families use
    `from __future__ import annotations`); None: not checked here (tuples; dicts are checked as rope objects)."""
    base = annotation.replace(" ", "").replace("|None", "").replace("None|", "")
    if name.endswith("_token_id"):
        return _TOKEN_IDS
    return {"int": _POSITIVE_INT, "float": _number_kind(name), "bool": _BOOL, "str": _STR}.get(base)


def _fits(value, kind: str) -> bool:
    if kind == _TOKEN_IDS:
        return value is None or _fits(value, _TOKEN_ID) or (
            isinstance(value, (list, tuple)) and bool(value) and all(_fits(v, _TOKEN_ID) for v in value))
    if kind in (_POSITIVE_INT, _NONNEG_INT, _TOKEN_ID):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return False
        return kind == _TOKEN_ID or value > 0 or (kind == _NONNEG_INT and value == 0)
    if kind in (_POSITIVE, _NONNEG, _FRACTION):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        return value > 0 and (kind != _FRACTION or value <= 1) or (kind == _NONNEG and value == 0)
    if kind == _BOOL:
        return isinstance(value, (bool, np.bool_))
    if kind == _STR:
        return isinstance(value, str)
    if kind == _OBJECT:
        return isinstance(value, dict)
    if kind == _STR_LIST:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    raise AssertionError(kind)


def _shown(value) -> str:
    """A value as config.json spells it (strings quoted, null, true), cut to 60 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad_value(path: Path, key: str, value, kind: str, fix: str) -> UserError:
    return UserError(f"{path}: {key!r} is {_shown(value)}, expected {kind}; {fix}")


_FIX = "correct it in config.json or re-download the model's config.json"


def check_config_dict(config_cls, raw: dict, path: Path, prefix: str = "") -> None:
    """Every value of a config.json dict that `config_cls.from_hf` reads has the right type and range: a
    UserError naming the file, the key, the value and what is expected otherwise."""
    kinds, nullable = dict(_EXTRA_KEYS), set(_NULLABLE)
    for f in dataclasses.fields(config_cls):
        kind = _field_kind(f.name, str(f.type))
        if kind is not None:
            kinds[f.name] = kind
            nullable.discard(f.name)
            if "None" in str(f.type) or kind == _TOKEN_IDS:
                nullable.add(f.name)
    for key, kind in kinds.items():
        if key not in raw:
            continue
        value = raw[key]
        if value is None and key in nullable:
            continue
        if not _fits(value, kind):
            raise _bad_value(path, prefix + key, value, kind, _FIX)
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(raw.get(key), dict):
            _check_rope(raw[key], path, prefix + key)
    if prefix == "" and "text_config" in raw:  # a multimodal config (Gemma 3): the text model's values
        text = raw["text_config"]
        if text is not None and not isinstance(text, dict):
            raise _bad_value(path, "text_config", text, _OBJECT, _FIX)
        check_config_dict(config_cls, text or {}, path, "text_config.")


def _check_rope(rope: dict, path: Path, where: str) -> None:
    for key, value in rope.items():
        if isinstance(value, dict) and key in ("full_attention", "sliding_attention"):  # Gemma 3: per layer type
            _check_rope(value, path, f"{where}.{key}")
        elif key in _ROPE_KEYS and not (value is None and key == "partial_rotary_factor"):
            if not _fits(value, _ROPE_KEYS[key]):
                raise _bad_value(path, f"{where}.{key}", value, _ROPE_KEYS[key], _FIX)


def check_config(cfg, path, what: str = "config.json", fix: str = _FIX) -> None:
    """The values of a built config (defaults and derived values included) have the types and ranges of its
    fields: a UserError naming the file and the field otherwise (e.g. a GGUF whose metadata gives 0 layers)."""
    for f in dataclasses.fields(cfg):
        kind, value = _field_kind(f.name, str(f.type)), getattr(cfg, f.name)
        if kind is None or (value is None and ("None" in str(f.type) or kind == _TOKEN_IDS)):
            continue
        if not _fits(value, kind):
            raise UserError(f"{path}: {what} gives {f.name}={_shown(value)}, expected {kind}; {fix}")


def parse_config(config_cls, raw: dict, path: Path):
    """`config_cls.from_hf(raw)`, its values checked first (`check_config_dict`): a wrong type or range, a key
    it needs and `raw` lacks, or a setting the family does not support is a UserError naming the file."""
    check_config_dict(config_cls, raw, path)
    try:
        cfg = config_cls.from_hf(raw)
    except KeyError as e:
        raise UserError(f"{path}: required key {e.args[0]!r} is missing; re-download the model's config.json or "
                        "add the key") from e
    except UserError as e:  # ConfigError: a setting the family does not support
        raise UserError(f"{path}: {e}") from e
    except (TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
        raise UserError(f"{path}: a value in it cannot be used ({type(e).__name__}: {one_line(e)}); {_FIX}") from e
    check_config(cfg, path)
    return cfg


def read_tokenizer(path: Path) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json file."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot parse
        raise UserError(f"{path}: not a valid tokenizer.json ({one_line(e)}); re-download it or pass another "
                        "tokenizer file") from e


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: model.safetensors, or the shards its index lists."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index}: no 'weight_map' object; re-download it or pass another model folder")
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise UserError(f"{folder}: shards listed in {index.name} are missing: {missing}")
        return [folder / s for s in shards] + [index]
    raise UserError(
        f"{folder}: no model.safetensors or model.safetensors.index.json (PyTorch .bin checkpoints are not "
        "supported; re-save with safe_serialization=True)"
    )


def read_safetensors(files: list[Path]) -> dict[str, Lazy]:
    """{name: `Lazy` tensor} of the given safetensors files: only the headers are read here; a tensor's bytes
    are read (memory-mapped; bf16 as ml_dtypes.bfloat16) when it is used, and `x[index]` reads only the slice."""
    def header(path: Path) -> dict[str, tuple[list[int], str]]:
        """{name: (shape, dtype)}; safetensors checks that the header is valid and that the file holds every
        tensor."""
        try:
            with safe_open(str(path), framework="np") as st:
                return {k: (st.get_slice(k).get_shape(), st.get_slice(k).get_dtype()) for k in st.keys()}
        except SafetensorError as e:
            raise UserError(f"{path}: not a valid safetensors file, truncated or corrupt ({one_line(e)}); "
                            "re-download it or re-save the model") from e

    def entry(path: str, name: str, shape, dtype: str) -> Lazy:
        def read():
            with safe_open(path, framework="np") as st:
                return st.get_tensor(name)

        def take(index):
            with safe_open(path, framework="np") as st:
                return st.get_slice(name)[index]

        return Lazy(shape, read, take, dtype=dtype, origin=path)

    tensors = {}
    for f in files:
        if f.suffix == ".safetensors":
            tensors.update({k: entry(str(f), k, *info) for k, info in header(f).items()})
    return tensors


def _token_content(value) -> str | None:
    """tokenizer_config.json spells special tokens as a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def special_token_ids(folder: Path | None, tokenizer, cfg) -> tuple[dict, list[Path]]:
    """{'bos'|'eos'|'pad': id or None}, preferring tokenizer_config.json over the model config."""
    ids = {k: getattr(cfg, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    path = folder / "tokenizer_config.json" if folder is not None else None
    if path is None or not path.exists():
        return ids, []
    tc = read_json(path)
    for key in ids:
        content = _token_content(tc.get(f"{key}_token"))
        if isinstance(content, str) and tokenizer.token_to_id(content) is not None:
            ids[key] = tokenizer.token_to_id(content)
    return ids, [path]

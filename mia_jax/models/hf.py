"""Hugging Face model folders: config.json, (sharded) safetensors, tokenizer.json, tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from mia_jax.errors import UserError
from mia_jax.models.tensors import Lazy


def one_line(e: Exception) -> str:
    """The first line of an exception's message (for a one-line UserError)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def read_json(path: Path) -> dict:
    """A JSON object file (config.json, tokenizer_config.json, a shard index)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read it as JSON ({one_line(e)}); re-download it or pass another "
                        "model folder") from e
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, found a {type(data).__name__}; re-download it or pass "
                        "another model folder")
    return data


def parse_config(config_cls, raw: dict, path: Path):
    """`config_cls.from_hf(raw)`, where a key it needs and `raw` lacks is a UserError naming the key."""
    try:
        return config_cls.from_hf(raw)
    except KeyError as e:
        raise UserError(f"{path}: required key {e.args[0]!r} is missing; re-download the model's config.json or "
                        "add the key") from e


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
    from safetensors import SafetensorError, safe_open

    def header(path: Path) -> dict[str, list[int]]:
        """{name: shape}; safetensors checks that the header is valid and that the file holds every tensor."""
        try:
            with safe_open(str(path), framework="np") as st:
                return {k: st.get_slice(k).get_shape() for k in st.keys()}
        except SafetensorError as e:
            raise UserError(f"{path}: not a valid safetensors file, truncated or corrupt ({one_line(e)}); "
                            "re-download it or re-save the model") from e

    def entry(path: str, name: str, shape) -> Lazy:
        def read():
            with safe_open(path, framework="np") as st:
                return st.get_tensor(name)

        def take(index):
            with safe_open(path, framework="np") as st:
                return st.get_slice(name)[index]

        return Lazy(shape, read, take)

    tensors = {}
    for f in files:
        if f.suffix == ".safetensors":
            tensors.update({k: entry(str(f), k, shape) for k, shape in header(f).items()})
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
        if content is not None and tokenizer.token_to_id(content) is not None:
            ids[key] = tokenizer.token_to_id(content)
    return ids, [path]

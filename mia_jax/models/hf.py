"""Hugging Face model folders: config.json, (sharded) safetensors, tokenizer.json, tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from mia_jax.errors import UserError
from mia_jax.models.layers import Lazy


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from e


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: model.safetensors, or the shards its index lists."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        shards = sorted(set(read_json(index)["weight_map"].values()))
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
    from safetensors import safe_open

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
            with safe_open(str(f), framework="np") as st:
                tensors.update({k: entry(str(f), k, st.get_slice(k).get_shape()) for k in st.keys()})
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

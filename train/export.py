"""Save a model of any family in the Hugging Face layout (config.json + model.safetensors + tokenizer.json), so that
``mia_jax.models.load(folder)``, ``mia-jax eval --model folder`` and transformers read it back.

The tensors come from the family's weight spec (``type(model).spec.to_hf``: the inverse of loading, with its
transposes, reshapes and fused tensors), the config.json from the config's ``to_hf()``. Weights are written in
float32 (the master weights).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from mia_jax.errors import UserError


def tensors_to_hf(model: nnx.Module, params: dict) -> dict[str, np.ndarray]:
    """Nested params of ``model`` (``nnx.to_pure_dict`` of its state) -> HF-named float32 numpy tensors."""
    spec = getattr(type(model), "spec", None)
    if spec is None:
        raise UserError(f"export: {type(model).__name__} has no weight spec")
    return spec.to_hf(model.config, params)


def save_hf(folder: str | os.PathLike, model: nnx.Module, tokenizer, params: dict | None = None) -> Path:
    """Write ``folder``/{config.json, model.safetensors, tokenizer.json} atomically (a temporary folder renamed
    into place). ``params`` (a nested dict) replaces the model's own parameters when given."""
    hf_config = model.config.to_hf()
    if params is None:
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), params)
    tensors = tensors_to_hf(model, params)
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tokenizer.save(str(tmp / "tokenizer.json"))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder

"""Flax NNX causal LMs and checkpoint loading (HF folders, GGUF files)."""

from mia_jax.models.checkpoint import LoadedModel, load, resolve_model
from mia_jax.models.llama import Llama, LlamaConfig

__all__ = ["Llama", "LlamaConfig", "LoadedModel", "load", "resolve_model"]

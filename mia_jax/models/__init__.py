"""Flax NNX causal LMs and checkpoint loading (HF folders, GGUF files, packaged offline models)."""

from mia_jax.models.checkpoint import ARCHITECTURES, PACKAGED_MODELS, LoadedModel, architecture, load, resolve_model
from mia_jax.models.gemma3 import Gemma3, Gemma3Config
from mia_jax.models.llama import Llama, LlamaConfig

__all__ = ["ARCHITECTURES", "PACKAGED_MODELS", "Gemma3", "Gemma3Config", "Llama", "LlamaConfig", "LoadedModel",
           "architecture", "load", "resolve_model"]

"""Phi-3 (Phi-3-mini / -medium, Phi-3.5-mini) in Flax NNX: Llama's block, with Phi-3's config and weight names.

The network is Llama's (pre-norm RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, an optional sliding window
on every layer); only the checkpoints differ: transformers' Phi3 fuses q/k/v into one `qkv_proj` (rows: H query
heads, then KV key heads, then KV value heads) and gate/up into one `gate_up_proj` (rows: gate, then up), and so
does llama.cpp (`attn_qkv`, `ffn_up`). The weight spec splits them into the shared wq/wk/wv and w_gate/w_up.
Not supported: "longrope" scaling (Phi-3-*-128k) and partial rotary factors other than 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import numpy as np

from mia_jax.models import llama
from mia_jax.models.layers import ConfigError, check_model_type, config_from_hf, token_ids
from mia_jax.models.llama import Llama, LlamaConfig, parse_rope
from mia_jax.models.tensors import GGUFMeta
from mia_jax.models.weights import WeightSpec, linear

MODEL_TYPE = "phi3"


@dataclasses.dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    """A `LlamaConfig` read from a Phi-3 config.json (no biases; the sliding window, if any, on every layer)."""

    model_type: str = MODEL_TYPE
    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)
    __hash__ = LlamaConfig.__hash__  # (a frozen dataclass would otherwise hash its fields, dicts included)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "Phi3Config":
        """From a config.json dict (``ConfigError`` for a model type or activation not implemented)."""
        check_model_type(hf.get("model_type"), cls.model_types, "Phi-3")
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu' (SwiGLU) is implemented")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
        if factor != 1.0:
            raise ConfigError(f"partial_rotary_factor={factor} is not supported by the Phi-3 implementation")
        theta, rope_scaling = parse_rope(hf)
        if rope_scaling is not None:
            rope_scaling = {k: v for k, v in rope_scaling.items() if k != "partial_rotary_factor"}
            rope_scaling = None if rope_scaling == {"rope_type": "default"} else rope_scaling
        return config_from_hf(cls, hf, **token_ids(hf, bos=1, eos=32000, pad=32000), rope_theta=theta,
                              rope_scaling=rope_scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
                              max_position_embeddings=hf.get("max_position_embeddings", 4096),
                              attention_bias=False, attention_out_bias=False, layer_types=None)

    def to_hf(self) -> dict:
        """The config.json dict of this config (as Phi3ForCausalLM)."""
        hf = {k: v for k, v in super().to_hf().items() if k not in ("attention_bias", "mlp_bias", "layer_types")}
        return {**hf, "architectures": ["Phi3ForCausalLM"], "sliding_window": self.sliding_window}


# Hugging Face Phi3ForCausalLM <-> GGUF phi3: Llama's table with the fused projections
_QKV, _GATE_UP = ("self_attn.qkv_proj.weight", "attn_qkv.weight"), ("mlp.gate_up_proj.weight", "ffn_up.weight")
_LAYERS = {w.name: w for w in llama.SPEC.layers}
SPEC = WeightSpec("Phi-3", llama.dims, prefixes=(("model.", ""),), top=llama.TOP, layers=(
    _LAYERS["attn_norm"],
    linear("wq", *_QKV, ("embed", "heads", "head_dim")),
    linear("wk", *_QKV, ("embed", "kv_heads", "head_dim")),
    linear("wv", *_QKV, ("embed", "kv_heads", "head_dim")),
    _LAYERS["wo"],
    _LAYERS["mlp_norm"],
    linear("w_gate", *_GATE_UP, ("embed", "mlp")),
    linear("w_up", *_GATE_UP, ("embed", "mlp")),
    _LAYERS["w_down"],
))


class Phi3(Llama):
    """Phi-3 causal LM: `Llama` with Phi-3's weight spec."""

    spec = SPEC


params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf, SPEC.tensors_from_gguf, SPEC.gguf_to_hf()
from_params = Phi3.from_params


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> Phi3Config:
    """`Phi3Config` from `phi3.*` metadata (vocabulary size from token_embd when `arrays` is given)."""
    get = GGUFMeta(meta, arrays)
    if get("rope.scaling.attn_factor") is not None or get.has("rope_factors_long.weight"):
        raise ConfigError("Phi-3 GGUF with longrope factors (the 128k models) is not supported")
    heads = get("attention.head_count")
    return Phi3Config(
        vocab_size=get.vocab_size(),
        hidden_size=get("embedding_length"),
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=get("context_length", 4096),
        tie_word_embeddings=arrays is not None and not get.has("output.weight"),
        sliding_window=get("attention.sliding_window"),
        **get.special_ids(),
    )

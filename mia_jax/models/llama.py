"""Llama-family causal LM (SmolLM2, Llama 1/2/3, Mistral, Qwen2) in Flax NNX: its config, its weight spec and its
block on the shared decoder (`causal_lm.CausalLM`). Pre-norm RMSNorm layers, RoPE (rotate-half, transformers'
rope_type formulas; llama.cpp's rope_freqs factors from a GGUF), grouped-query attention with optional q/k/v and
output biases (Qwen2: q/k/v only) and an optional sliding window per layer (Mistral, Qwen2), a SwiGLU MLP.
Phi-3 (`phi3.py`) reuses all of it with its own config and weight names.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mia_jax.errors import UserError
from mia_jax.models.causal_lm import CausalLM, plus
from mia_jax.models.layers import (  # ConfigError: also imported from here
    ConfigError, BaseConfig, apply_rope, check_heads, check_model_type, config_from_hf, config_to_hf, inv_freq, rope_at,
    token_ids,
)
from mia_jax.models.tensors import GGUFMeta
from mia_jax.models.weights import WeightSpec, bias, embedding, linear, norm

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_SCALING = (None, "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")


# the rope_scaling keys each supported type reads (transformers' names)
ROPE_SCALING_KEYS = {"linear": ("factor",),
                     "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def check_rope_scaling(rope_scaling: dict | None) -> None:
    """Raises ``ConfigError`` when ``rope_scaling`` (a config.json dict or None) is of an unsupported type or lacks a
    key its type needs."""
    rope_type = (rope_scaling or {}).get("rope_type")
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise ConfigError(f"unsupported rope_scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_SCALING}")
    missing = [k for k in ROPE_SCALING_KEYS.get(rope_type, ()) if rope_scaling.get(k) is None]
    if missing:
        raise ConfigError(f"rope_scaling of type {rope_type!r} has no {missing[0]!r}; it needs "
                          f"{', '.join(ROPE_SCALING_KEYS[rope_type])}")
    if rope_type == "llama3" and not rope_scaling["high_freq_factor"] > rope_scaling["low_freq_factor"]:
        raise ConfigError(f"rope_scaling high_freq_factor={rope_scaling['high_freq_factor']} must be greater than "
                          f"low_freq_factor={rope_scaling['low_freq_factor']}")


def check_layer_types(layer_types, num_layers: int) -> tuple[str, ...] | None:
    """A per-layer list of 'full_attention' / 'sliding_attention' (as a tuple), validated."""
    if layer_types is None:
        return None
    layer_types = tuple(layer_types)
    bad = sorted(set(layer_types) - set(LAYER_TYPES))
    if bad or len(layer_types) != num_layers:
        raise ConfigError(f"layer_types must list one of {LAYER_TYPES} per layer ({num_layers}); got {layer_types}")
    return layer_types


def parse_rope(hf: Mapping[str, Any], default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from rope_theta/rope_scaling or a rope_parameters dict."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", default_theta))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    return float(theta), (None if rope_type == "default" else {**rope, "rope_type": rope_type})


@dataclasses.dataclass(frozen=True)
class LlamaConfig(BaseConfig):
    """Hyper-parameters of a Llama-family model (Hugging Face names; `from_hf` reads a config.json).

    `sliding_window` applies to the layers whose `layer_types` entry is 'sliding_attention', or to every
    layer when `layer_types` is None (Mistral). `attention_bias`: q/k/v projections have biases;
    `attention_out_bias`: so does the output projection (Llama's attention_bias sets both, Qwen2 only the first).
    """

    intermediate_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", ...}; None = plain RoPE
    rope_freq_factors: tuple[float, ...] | None = None  # llama.cpp's rope_freqs tensor (divides inv_freq)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attention_bias: bool = False
    attention_out_bias: bool = False
    model_type: str = "llama"
    model_types: ClassVar[tuple[str, ...]] = SUPPORTED_MODEL_TYPES

    def __post_init__(self):
        check_model_type(self.model_type, self.model_types, "the Llama implementation")
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        check_heads(self.hidden_size, self.num_attention_heads, self.num_key_value_heads)
        check_rope_scaling(self.rope_scaling)
        object.__setattr__(self, "layer_types", check_layer_types(self.layer_types, self.num_hidden_layers))

    def __hash__(self):  # rope_scaling is a dict; nnx graphdefs hash their static attributes
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=str))

    def sliding_layers(self) -> np.ndarray:
        """bool [num_hidden_layers]: which layers use the sliding window."""
        if self.sliding_window is None:
            return np.zeros(self.num_hidden_layers, bool)
        if self.layer_types is None:
            return np.ones(self.num_hidden_layers, bool)
        return np.array([t == "sliding_attention" for t in self.layer_types])

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "LlamaConfig":
        """From a Hugging Face `config.json` dict (rope given as rope_theta/rope_scaling or rope_parameters)."""
        model_type = check_model_type(hf.get("model_type"), cls.model_types, "the Llama implementation")
        if hf.get("mlp_bias"):
            raise ConfigError("mlp_bias=True is not supported by the Llama implementation")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is implemented")
        theta, rope_scaling = parse_rope(hf)
        layers = hf["num_hidden_layers"]
        sliding_window, layer_types = hf.get("sliding_window"), hf.get("layer_types")
        qkv_bias = out_bias = bool(hf.get("attention_bias", False))
        if model_type == "qwen2":  # q/k/v always have biases, o_proj never; the window only when switched on
            qkv_bias, out_bias = True, False
            if not hf.get("use_sliding_window", False):
                sliding_window, layer_types = None, None
            elif layer_types is None:
                start = hf.get("max_window_layers", 28)
                layer_types = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
        elif model_type == "llama":
            sliding_window, layer_types = None, None
        return config_from_hf(cls, hf, **token_ids(hf), rope_theta=theta, rope_scaling=rope_scaling,
                              sliding_window=sliding_window, layer_types=layer_types, attention_bias=qkv_bias,
                              attention_out_bias=out_bias)

    def to_hf(self) -> dict:
        """A config.json dict that `from_hf` reads back into this config (export)."""
        if self.rope_freq_factors is not None:
            raise UserError("export: this model has GGUF rope_freqs factors, which a Hugging Face config.json "
                            "cannot express")
        hf = config_to_hf(self, ("rope_theta", "rope_scaling", "rope_freq_factors", "attention_out_bias"),
                          hidden_act="silu", mlp_bias=False, rope_parameters={
                              "rope_type": "default", "rope_theta": self.rope_theta, **(self.rope_scaling or {})})
        hf["architectures"] = [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                "qwen2": "Qwen2ForCausalLM"}.get(self.model_type)]
        if self.model_type == "llama" and self.attention_bias != self.attention_out_bias:
            raise UserError("export: q/k/v biases without an output bias (Qwen2 style) are not a 'llama' config")
        if self.model_type == "qwen2":
            hf["use_sliding_window"] = self.sliding_window is not None
        return hf


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """The RoPE inverse frequencies [head_dim / 2] of config ``cfg`` (theta, scaling and frequency factors applied)."""
    return inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rope_freq_factors)


def rms_norm(x, weight, eps):
    """RMSNorm computed in float32, returned in the input dtype (as transformers does)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


# ----------------------------------------------------------------------------- weights


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `permute` of q/k projection rows (llama.cpp's interleaved RoPE)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _from_llama_cpp(heads: str):
    """llama.cpp stores the q/k rows of `llama` files (not qwen2's) permuted for its interleaved RoPE."""
    return lambda w, cfg: unpermute_qk(w, getattr(cfg, heads)) if cfg.model_type == "llama" else w


def dims(c) -> dict[str, int]:
    """Logical axis sizes of a Llama-shaped config."""
    return {"vocab": c.vocab_size, "embed": c.hidden_size, "norm": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "mlp": c.intermediate_size}


ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope scaling in a GGUF: read by config_from_gguf
# Hugging Face LlamaForCausalLM (also Mistral, Qwen2) <-> GGUF llama / qwen2 (llama.cpp's tensor names)
TOP = (
    embedding("embed", "embed_tokens.weight", "token_embd.weight"),
    norm("norm", "norm.weight", "output_norm.weight"),
    embedding("lm_head", "lm_head.weight", "output.weight", head=True, when=lambda c: not c.tie_word_embeddings),
)
SPEC = WeightSpec("Llama", dims, prefixes=(("model.", ""),), gguf_ignore=(ROPE_FREQS,), top=TOP, layers=(
    norm("attn_norm", "input_layernorm.weight", "attn_norm.weight"),
    linear("wq", "self_attn.q_proj.weight", "attn_q.weight", ("embed", "heads", "head_dim"),
           gguf_fix=_from_llama_cpp("num_attention_heads")),
    linear("wk", "self_attn.k_proj.weight", "attn_k.weight", ("embed", "kv_heads", "head_dim"),
           gguf_fix=_from_llama_cpp("num_key_value_heads")),
    linear("wv", "self_attn.v_proj.weight", "attn_v.weight", ("embed", "kv_heads", "head_dim")),
    bias("bq", "self_attn.q_proj.bias", "attn_q.bias", ("heads", "head_dim"), when=lambda c: c.attention_bias),
    bias("bk", "self_attn.k_proj.bias", "attn_k.bias", ("kv_heads", "head_dim"), when=lambda c: c.attention_bias),
    bias("bv", "self_attn.v_proj.bias", "attn_v.bias", ("kv_heads", "head_dim"), when=lambda c: c.attention_bias),
    linear("wo", "self_attn.o_proj.weight", "attn_output.weight", ("heads", "head_dim", "embed"), n_in=2),
    bias("bo", "self_attn.o_proj.bias", "attn_output.bias", when=lambda c: c.attention_out_bias),
    norm("mlp_norm", "post_attention_layernorm.weight", "ffn_norm.weight"),
    linear("w_gate", "mlp.gate_proj.weight", "ffn_gate.weight", ("embed", "mlp")),
    linear("w_up", "mlp.up_proj.weight", "ffn_up.weight", ("embed", "mlp")),
    linear("w_down", "mlp.down_proj.weight", "ffn_down.weight", ("mlp", "embed")),
))


# ----------------------------------------------------------------------------- the model


def _proj(h, p, w, b):
    return plus(jnp.einsum("btd,dhk->bthk", h, p[w]), p, b)


class Llama(CausalLM):
    """Llama-family causal LM (see `CausalLM` for `__call__`, `hidden_states` and `decode`)."""

    spec = SPEC

    def context(self, positions):
        """The RoPE tables of ``positions``."""
        return rope_at(positions, rope_inv_freq(self.config))

    def layer_inputs(self):
        """The per-layer sliding-window flags [num_layers]."""
        return jnp.asarray(self.config.sliding_layers())

    def normalize(self, x, w, b=None):
        """RMSNorm of x with scale ``w``; ``b`` unused."""
        return rms_norm(x, w, self.config.rms_norm_eps)

    def block(self, p, x, rope, sliding, attend):
        """One pre-norm decoder layer: x + attn(norm(x)), then + swiglu(norm(x))."""
        cfg = self.config
        h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
        q, k = apply_rope(_proj(h, p, "wq", "bq"), *rope), apply_rope(_proj(h, p, "wk", "bk"), *rope)
        attn = attend(q, k, _proj(h, p, "wv", "bv"), 1.0 / math.sqrt(cfg.head_dim), sliding)
        out = jnp.einsum("bthk,hkd->btd", attn, p["wo"])
        x = x + plus(out, p, "bo")
        h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
        gate = jax.nn.silu(h @ p["w_gate"])
        return x + (gate * (h @ p["w_up"])) @ p["w_down"]


# ----------------------------------------------------------------------------- checkpoints

params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf, SPEC.tensors_from_gguf, SPEC.gguf_to_hf()
from_params = Llama.from_params
GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2"}


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> LlamaConfig:
    """`LlamaConfig` from `{arch}.*` and `tokenizer.ggml.*` metadata (vocab size from the embedding when given)."""
    get = GGUFMeta(meta, arrays)
    heads, hidden = get("attention.head_count"), get("embedding_length")
    rope_freqs = (arrays or {}).get(ROPE_FREQS)
    return LlamaConfig(
        vocab_size=get.vocab_size(),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=get("attention.key_length") or get("rope.dimension_count") or hidden // heads,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=get.rope_scaling(),
        rope_freq_factors=None if rope_freqs is None else tuple(float(x) for x in np.asarray(rope_freqs)),
        max_position_embeddings=get("context_length", 2048),
        tie_word_embeddings=not get.has("output.weight") if arrays else False,
        sliding_window=get("attention.sliding_window"),
        attention_bias=get.has("blk.0.attn_q.bias"),
        attention_out_bias=get.has("blk.0.attn_output.bias"),
        model_type=GGUF_MODEL_TYPES[get.arch],
        **get.special_ids(),
    )

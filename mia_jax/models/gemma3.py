"""Gemma 3 text model (Gemma-3-270m ... 27b language backbone) in Flax NNX: config, weight spec, block.

Differences from Llama (whose RoPE, masks and attention core it shares through `causal_lm.CausalLM`):
interleaved local (sliding-window) and global attention layers, each with its own RoPE base
(`rope_local_base_freq` 10k, `rope_theta` 1M with its rope_scaling); RMSNorm on q and k; norms before
*and after* attention and MLP; Gemma RMSNorm scales by (1 + weight) in float32 (llama.cpp stores 1 + weight);
the embedding is multiplied by sqrt(hidden_size) rounded to the parameter dtype; scores are scaled by
query_pre_attn_scalar**-0.5; a GeGLU MLP with tanh-approximated GELU.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mia_jax.models import llama
from mia_jax.models.causal_lm import CausalLM
from mia_jax.models.layers import (
    BaseConfig, ConfigError, apply_rope, check_heads, config_to_hf, inv_freq, rope_at, token_ids,
)
from mia_jax.models.llama import check_layer_types, check_rope_scaling
from mia_jax.models.tensors import GGUFMeta
from mia_jax.models.weights import WeightSpec, linear, norm

SUPPORTED_MODEL_TYPES = ("gemma3_text", "gemma3")
SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
DEFAULT_SLIDING_PATTERN = 6  # every 6th layer global (transformers' and llama.cpp's default for Gemma 3)


def _rope_for(hf: Mapping[str, Any]) -> tuple[float, dict | None, float, dict | None]:
    """(global theta, global scaling, local theta, local scaling) from either config spelling."""
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and ("full_attention" in params or "sliding_attention" in params):
        per_type = {k: dict(params.get(k) or {}) for k in ("full_attention", "sliding_attention")}
    else:  # older configs: rope_theta + rope_scaling (global only) + rope_local_base_freq
        per_type = {"full_attention": dict(params or hf.get("rope_scaling") or {}), "sliding_attention": {}}
        per_type["full_attention"].setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        per_type["sliding_attention"]["rope_theta"] = hf.get("rope_local_base_freq", 10_000.0)
    out = []
    for key, default in (("full_attention", 1_000_000.0), ("sliding_attention", 10_000.0)):
        rope = per_type[key]
        theta = float(rope.pop("rope_theta", default))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        out += [theta, None if rope_type == "default" else {**rope, "rope_type": rope_type}]
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Gemma3Config(BaseConfig):
    """Hyper-parameters of a Gemma 3 text model (Hugging Face names; `from_hf` reads a config.json)."""

    intermediate_size: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...] | None = None  # None: every 6th layer full_attention, the rest sliding
    sliding_window: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global (full_attention) layers
    rope_scaling: dict | None = None  # global layers only
    rope_local_base_freq: float = 10_000.0
    rope_local_scaling: dict | None = None
    query_pre_attn_scalar: float = 256.0
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = True
    model_type: str = "gemma3_text"

    def __post_init__(self):
        check_heads(self.hidden_size, self.num_attention_heads, self.num_key_value_heads)
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        check_rope_scaling(self.rope_scaling)
        check_rope_scaling(self.rope_local_scaling)
        layer_types = self.layer_types
        if layer_types is None:
            layer_types = ["sliding_attention" if (i + 1) % DEFAULT_SLIDING_PATTERN else "full_attention"
                           for i in range(self.num_hidden_layers)]
        object.__setattr__(self, "layer_types", check_layer_types(layer_types, self.num_hidden_layers))

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=str))

    def sliding_layers(self) -> np.ndarray:
        """A bool [num_layers] array: True for the layers with sliding-window attention."""
        return np.array([t == "sliding_attention" for t in self.layer_types])

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "Gemma3Config":
        """From a `gemma3_text` config.json, or a multimodal `gemma3` one (its `text_config` is used)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"unsupported model_type {model_type!r} for Gemma 3; supported: {SUPPORTED_MODEL_TYPES}")
        if model_type == "gemma3":
            hf = {**(hf.get("text_config") or {}), "model_type": "gemma3_text",
                  **{k: hf[k] for k in ("tie_word_embeddings",) if k in hf and k not in (hf.get("text_config") or {})}}
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in SUPPORTED_ACTIVATIONS:
            raise ConfigError(f"unsupported hidden_activation {act!r}; supported: {SUPPORTED_ACTIVATIONS}")
        for cap in ("final_logit_softcapping", "attn_logit_softcapping"):  # Gemma 2's; None in Gemma 3
            if hf.get(cap) is not None:
                raise ConfigError(f"{cap}={hf[cap]} is not supported by the Gemma 3 implementation (transformers' "
                                  "Gemma 3 has none either)")
        for flag in ("attention_bias", "use_bidirectional_attention"):
            if hf.get(flag):
                raise ConfigError(f"{flag}=True is not supported by the Gemma 3 implementation")
        layers = hf.get("num_hidden_layers", 26)
        layer_types = hf.get("layer_types")
        if layer_types is None:
            pattern = hf.get("sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
            layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        theta, scaling, local_theta, local_scaling = _rope_for(hf)
        heads = hf.get("num_attention_heads", 8)
        return cls(
            vocab_size=hf.get("vocab_size", 262208),
            hidden_size=hf.get("hidden_size", 2304),
            intermediate_size=hf.get("intermediate_size", 9216),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads", 4),
            head_dim=hf.get("head_dim", 256),
            layer_types=layer_types,
            sliding_window=hf.get("sliding_window", 4096),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            rope_local_base_freq=local_theta,
            rope_local_scaling=local_scaling,
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            max_position_embeddings=hf.get("max_position_embeddings", 131072),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            **token_ids(hf, bos=2, eos=1, pad=0),
        )

    def to_hf(self) -> dict:
        """A config.json dict (gemma3_text) that `from_hf` reads back into this config (export)."""
        rope = lambda theta, scaling: {"rope_type": "default", **(scaling or {}), "rope_theta": theta}  # noqa: E731
        return config_to_hf(
            self, ("rope_theta", "rope_scaling", "rope_local_base_freq", "rope_local_scaling"),
            architectures=["Gemma3ForCausalLM"], hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=int(q) if (q := self.query_pre_attn_scalar).is_integer() else q,  # transformers: int
            rope_parameters={"full_attention": rope(self.rope_theta, self.rope_scaling),
                             "sliding_attention": rope(self.rope_local_base_freq, self.rope_local_scaling)})


def gemma_rms_norm(x, weight, eps):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), all in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


# ----------------------------------------------------------------------------- weights


def _minus_one(w, cfg):
    """llama.cpp's convert_hf_to_gguf.py stores Gemma's norm weights as 1 + weight."""
    return w - 1.0


def _norm(name, hf, gguf, axes=("norm",)):
    """A zero-centred Gemma norm scale (the scale is 1 + weight)."""
    return norm(name, hf, gguf, axes, init="zeros", gguf_fix=_minus_one)


# Hugging Face Gemma3ForCausalLM / Gemma3ForConditionalGeneration (new and old prefixes) <-> GGUF gemma3
SPEC = WeightSpec(
    "Gemma 3", llama.dims, top=(llama.TOP[0], _norm("norm", "norm.weight", "output_norm.weight"), llama.TOP[2]),
    prefixes=(("model.", ""), ("model.language_model.", ""), ("language_model.model.", "language_model.")),
    layers=(
        _norm("attn_norm", "input_layernorm.weight", "attn_norm.weight"),
        *(w for w in llama.SPEC.layers if w.name in ("wq", "wk", "wv")),  # (q/k un-permuted for llama files only)
        _norm("q_norm", "self_attn.q_norm.weight", "attn_q_norm.weight", ("head_dim",)),
        _norm("k_norm", "self_attn.k_norm.weight", "attn_k_norm.weight", ("head_dim",)),
        linear("wo", "self_attn.o_proj.weight", "attn_output.weight", ("heads", "head_dim", "embed"), n_in=2),
        _norm("post_attn_norm", "post_attention_layernorm.weight", "post_attention_norm.weight"),
        _norm("mlp_norm", "pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        *(w for w in llama.SPEC.layers if w.name in ("w_gate", "w_up", "w_down")),
        _norm("post_mlp_norm", "post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ))


# ----------------------------------------------------------------------------- the model


class Gemma3(CausalLM):
    """Gemma 3 causal LM (text); see `CausalLM` for `__call__`, `hidden_states` and `decode`."""

    spec = SPEC

    def context(self, positions):
        """(global, local) RoPE (cos, sin) tables."""
        cfg = self.config
        return (rope_at(positions, inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)),
                rope_at(positions, inv_freq(cfg.head_dim, cfg.rope_local_base_freq, cfg.rope_local_scaling)))

    def layer_inputs(self):
        """The per-layer sliding-window flags [num_layers]."""
        return jnp.asarray(self.config.sliding_layers())

    def embed_tokens(self, input_ids, positions):
        """Token embeddings [B, T, D] of ``input_ids``, scaled by sqrt(hidden_size) as Gemma does."""
        x = super().embed_tokens(input_ids, positions)
        return x * jnp.asarray(self.config.hidden_size ** 0.5, x.dtype)

    def normalize(self, x, w, b=None):
        """Gemma's RMSNorm of x (scale 1 + ``w``); ``b`` unused."""
        return gemma_rms_norm(x, w, self.config.rms_norm_eps)

    def block(self, p, x, ropes, local, attend):
        """Attention with q/k norms and a post-norm, then the GeGLU MLP with its pre- and post-norms."""
        cfg, eps = self.config, self.config.rms_norm_eps
        cos, sin = (jnp.where(local, a, b) for a, b in zip(ropes[1], ropes[0]))
        h = gemma_rms_norm(x, p["attn_norm"], eps)
        q = apply_rope(gemma_rms_norm(jnp.einsum("btd,dhk->bthk", h, p["wq"]), p["q_norm"], eps), cos, sin)
        k = apply_rope(gemma_rms_norm(jnp.einsum("btd,dhk->bthk", h, p["wk"]), p["k_norm"], eps), cos, sin)
        attn = attend(q, k, jnp.einsum("btd,dhk->bthk", h, p["wv"]), cfg.query_pre_attn_scalar ** -0.5, local)
        x = x + gemma_rms_norm(jnp.einsum("bthk,hkd->btd", attn, p["wo"]), p["post_attn_norm"], eps)
        h = gemma_rms_norm(x, p["mlp_norm"], eps)
        gate = jax.nn.gelu((h @ p["w_gate"]).astype(jnp.float32), approximate=True).astype(h.dtype)
        return x + gemma_rms_norm((gate * (h @ p["w_up"])) @ p["w_down"], p["post_mlp_norm"], eps)


# ----------------------------------------------------------------------------- checkpoints

params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf, SPEC.tensors_from_gguf, SPEC.gguf_to_hf()
from_params = Gemma3.from_params


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> Gemma3Config:
    """`Gemma3Config` from `gemma3.*` metadata. A GGUF records neither the layer pattern nor the local RoPE base
    nor query_pre_attn_scalar; llama.cpp (and transformers' GGUF loader) use every-6th-global, 10k and head_dim."""
    get = GGUFMeta(meta, arrays)
    heads, hidden = get("attention.head_count"), get("embedding_length")
    head_dim = get("attention.key_length") or hidden // heads
    layers = get("block_count")
    pattern = get("attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
    return Gemma3Config(
        vocab_size=get.vocab_size(),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        layer_types=["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)],
        sliding_window=get("attention.sliding_window", 4096),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 1_000_000.0)),
        rope_scaling=get.rope_scaling(),
        # llama.cpp: 1/sqrt(hidden/heads) for the 62-layer 27B model, 1/sqrt(head_dim) otherwise
        query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim),
        max_position_embeddings=get("context_length", 131072),
        tie_word_embeddings=not get.has("output.weight"),
        **get.special_ids(),
    )

"""Llama-family causal LM (SmolLM2, Llama 1/2/3, Mistral, Qwen2) in Flax NNX.

Decoder layers are stored stacked on a leading layer axis and applied with `jax.lax.scan`, so compile
time does not grow with depth. Weight layouts are `[in, out]` (heads kept as their own axis);
`params_from_hf` converts a Hugging Face state dict to them. RoPE, masking, grouped-query attention and
the KV cache live in `layers.py` (shared with the other families; re-exported here for older imports).
`decode` is the incremental forward used by `mia_jax.generate`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.models import layers as L
from mia_jax.models.layers import (  # noqa: F401 - re-exported: gemma3, bert and older code import them from here
    DTYPES, ConfigError, apply_rope, causal_mask, gqa_attention, init_param, inv_freq, rope_at, rope_tables,
    scan_layers,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_SCALING = (None, "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")

def _check_model_type(model_type):
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    return model_type


def check_rope_scaling(rope_scaling: dict | None) -> None:
    rope_type = (rope_scaling or {}).get("rope_type")
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise ConfigError(f"unsupported rope_scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_SCALING}")


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


def first_id(value):
    """Llama 3 configs list several eos ids; the first is the one used here."""
    return value[0] if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama-family model (Hugging Face names; `from_hf` reads a config.json).

    `sliding_window` applies to the layers whose `layer_types` entry is 'sliding_attention', or to every
    layer when `layer_types` is None (Mistral). `attention_bias`: q/k/v projections have biases;
    `attention_out_bias`: so does the output projection (Llama's attention_bias sets both, Qwen2 only the first).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
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
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        _check_model_type(self.model_type)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
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
        model_type = _check_model_type(hf.get("model_type"))
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
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads"),
            head_dim=hf.get("head_dim"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            sliding_window=sliding_window,
            layer_types=layer_types,
            attention_bias=qkv_bias,
            attention_out_bias=out_bias,
            model_type=model_type,
            bos_token_id=first_id(hf.get("bos_token_id")),
            eos_token_id=first_id(hf.get("eos_token_id")),
            pad_token_id=first_id(hf.get("pad_token_id")),
        )


# ----------------------------------------------------------------------------- shared building blocks


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    return inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rope_freq_factors)


def rms_norm(x, weight, eps):
    """RMSNorm computed in float32, returned in the input dtype (as transformers does)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def build_from_params(module_cls, cfg, params: dict, dtype: str = "float32", place=None):
    """Build `module_cls(cfg, dtype)` holding `params` (a nested dict of its state) without random init."""
    return L.build_module(module_cls, cfg, params, dtype, place)


# ----------------------------------------------------------------------------- the model


class DecoderLayers(nnx.Module):
    """All decoder layers; every parameter has a leading [num_hidden_layers] axis."""

    def __init__(self, cfg: LlamaConfig, dtype, rngs: nnx.Rngs):
        n, D, F = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
        H, KV, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.attn_norm = nnx.Param(jnp.ones((n, D), dtype))
        self.wq = init_param(rngs, (n, D, H, Dh), dtype, D)
        self.wk = init_param(rngs, (n, D, KV, Dh), dtype, D)
        self.wv = init_param(rngs, (n, D, KV, Dh), dtype, D)
        self.wo = init_param(rngs, (n, H, Dh, D), dtype, H * Dh)
        if cfg.attention_bias:
            self.bq = nnx.Param(jnp.zeros((n, H, Dh), dtype))
            self.bk = nnx.Param(jnp.zeros((n, KV, Dh), dtype))
            self.bv = nnx.Param(jnp.zeros((n, KV, Dh), dtype))
        if cfg.attention_out_bias:
            self.bo = nnx.Param(jnp.zeros((n, D), dtype))
        self.mlp_norm = nnx.Param(jnp.ones((n, D), dtype))
        self.w_gate = init_param(rngs, (n, D, F), dtype, D)
        self.w_up = init_param(rngs, (n, D, F), dtype, D)
        self.w_down = init_param(rngs, (n, F, D), dtype, F)

    def __call__(self, x, cfg: LlamaConfig, cos, sin, full_mask, window_mask):
        sliding = jnp.asarray(cfg.sliding_layers())
        layer = lambda p, h, s: _layer(cfg, p, h, cos, sin, jnp.where(s, window_mask, full_mask))  # noqa: E731
        return scan_layers(self, layer, x, sliding)

    def decode(self, x, cfg: LlamaConfig, cos, sin, cache: dict, full_mask, window_mask):
        """New tokens x [B, T, D] against the KV cache (masks [B, T, S]) -> (x, cache)."""
        def layer(p, h, s):
            q, k, v = _attention_inputs(cfg, p, h, cos, sin)
            mask = jnp.where(s, window_mask, full_mask)
            return q, k, v, mask, 1.0 / math.sqrt(cfg.head_dim), lambda attn: _attention_output(cfg, p, h, attn)

        return L.scan_with_cache(L.stacked_params(self), layer, x, jnp.asarray(cfg.sliding_layers()), cache)


def _proj(h, p, w, b):
    y = jnp.einsum("btd,dhk->bthk", h, p[w])
    return y + p[b] if b in p else y


def _attention_inputs(cfg: LlamaConfig, p, x, cos, sin):
    """q [B, T, H, Dh] and k, v [B, T, KV, Dh] of one layer, RoPE applied."""
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    return apply_rope(_proj(h, p, "wq", "bq"), cos, sin), apply_rope(_proj(h, p, "wk", "bk"), cos, sin), \
        _proj(h, p, "wv", "bv")


def _layer(cfg: LlamaConfig, p, x, cos, sin, mask):
    """One pre-norm decoder layer: x + attn(norm(x)), then + swiglu(norm(x))."""
    q, k, v = _attention_inputs(cfg, p, x, cos, sin)
    return _attention_output(cfg, p, x, gqa_attention(q, k, v, mask, 1.0 / math.sqrt(cfg.head_dim)))


def _attention_output(cfg: LlamaConfig, p, x, attn):
    """The rest of the layer after attention: output projection, residual, SwiGLU MLP."""
    out = jnp.einsum("bthk,hkd->btd", attn, p["wo"])
    x = x + (out + p["bo"] if "bo" in p else out)
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    gate = jax.nn.silu(h @ p["w_gate"])
    return x + (gate * (h @ p["w_up"])) @ p["w_down"]


class Llama(nnx.Module):
    """Llama-family causal LM. `__call__` / `hidden_states` take no attention mask (batches are right-padded,
    attention is causal); `decode` runs new tokens against a KV cache with per-row positions and a key mask."""

    def __init__(self, config: LlamaConfig, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        if dtype not in DTYPES:
            raise ConfigError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.dtype = dtype
        dt = DTYPES[dtype]
        V, D = config.vocab_size, config.hidden_size
        self.embed = nnx.Param((jax.random.normal(rngs.params(), (V, D)) * 0.02).astype(dt))
        self.layers = DecoderLayers(config, dt, rngs)
        self.norm = nnx.Param(jnp.ones((D,), dt))
        self.lm_head = None if config.tie_word_embeddings else init_param(rngs, (V, D), dt, D)

    def hidden_states(self, input_ids):
        """int [B, T] -> final-norm hidden states [B, T, D] (parameter dtype)."""
        T = input_ids.shape[1]
        cos, sin = rope_tables(T, rope_inv_freq(self.config))
        full = causal_mask(T, None)
        window = full if self.config.sliding_window is None else causal_mask(T, self.config.sliding_window)
        x = jnp.take(self.embed[...], input_ids, axis=0)
        x = self.layers(x, self.config, cos, sin, full, window)
        return rms_norm(x, self.norm[...], self.config.rms_norm_eps)

    def unembedding(self):
        """[V, D]: the lm_head weight, or the token embedding when tied."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids):
        """int [B, T] -> float32 logits [B, T, V]."""
        h = self.hidden_states(input_ids)
        return jnp.einsum("btd,vd->btv", h, self.unembedding(), preferred_element_type=jnp.float32)

    def init_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `decode`: k, v [L, B, max_len, KV, Dh] and the next slot, `index`."""
        cfg = self.config
        return L.init_cache(cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim,
                            self.embed[...].dtype)

    def decode(self, input_ids, cache: dict, positions, key_mask):
        """Incremental forward: input_ids [B, T] written into cache slots index..index+T-1; positions [B, T]
        (per row, e.g. arange - n_pad for left-padded rows); key_mask [B, S] the valid (non-pad) cache slots.
        -> (float32 logits [B, T, V], cache)."""
        cfg = self.config
        cos, sin = rope_at(positions, rope_inv_freq(cfg))
        full, window = L.cache_masks(cache, input_ids.shape[1], key_mask, cfg.sliding_window)
        x = jnp.take(self.embed[...], input_ids, axis=0)
        x, cache = self.layers.decode(x, cfg, cos, sin, cache, full, window)
        return L.unembed(rms_norm(x, self.norm[...], cfg.rms_norm_eps), self.unembedding()), cache


# ----------------------------------------------------------------------------- checkpoints


def params_from_hf(cfg: LlamaConfig, tensors: Mapping[str, np.ndarray]) -> dict:
    """A Hugging Face Llama state dict (numpy, [out, in] weights) -> nested dict matching `Llama`'s state."""
    D, H, KV, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    # internal name -> (HF name inside model.layers.{i}., conversion of the [out, in] weight)
    layer_table = {
        "attn_norm": ("input_layernorm.weight", lambda w: w),
        "wq": ("self_attn.q_proj.weight", lambda w: w.T.reshape(D, H, Dh)),
        "wk": ("self_attn.k_proj.weight", lambda w: w.T.reshape(D, KV, Dh)),
        "wv": ("self_attn.v_proj.weight", lambda w: w.T.reshape(D, KV, Dh)),
        "wo": ("self_attn.o_proj.weight", lambda w: w.T.reshape(H, Dh, D)),
        "mlp_norm": ("post_attention_layernorm.weight", lambda w: w),
        "w_gate": ("mlp.gate_proj.weight", lambda w: w.T),
        "w_up": ("mlp.up_proj.weight", lambda w: w.T),
        "w_down": ("mlp.down_proj.weight", lambda w: w.T),
    }
    if cfg.attention_bias:
        layer_table.update({
            "bq": ("self_attn.q_proj.bias", lambda b: b.reshape(H, Dh)),
            "bk": ("self_attn.k_proj.bias", lambda b: b.reshape(KV, Dh)),
            "bv": ("self_attn.v_proj.bias", lambda b: b.reshape(KV, Dh)),
        })
    if cfg.attention_out_bias:
        layer_table["bo"] = ("self_attn.o_proj.bias", lambda b: b)

    get = L.Tensors(tensors, ("",), "model.embed_tokens.weight", "Llama")
    out = {"embed": get.lazy("model.embed_tokens.weight"), "layers": get.stack(layer_table, cfg.num_hidden_layers,
           "model.layers.{i}."), "norm": get.lazy("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get.lazy("lm_head.weight")
    return out


def from_params(cfg: LlamaConfig, params: dict, dtype: str = "float32", place=None) -> Llama:
    """Build a `Llama` holding `params` (from `params_from_hf`) without random initialisation."""
    return build_from_params(Llama, cfg, params, dtype, place)


# GGUF tensor name -> Hugging Face name ("{i}" is the layer index); llama and qwen2 files.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "rope_freqs.weight": "rope_freqs.weight",  # llama 3 rope scaling: read by config_from_gguf, then dropped
}
ROPE_FREQS = "rope_freqs.weight"
GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2"}


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `permute` of q/k projection rows (llama.cpp's interleaved RoPE)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> LlamaConfig:
    """`LlamaConfig` from `{arch}.*` and `tokenizer.ggml.*` metadata (vocab size from the embedding when given)."""
    arch = meta["general.architecture"]
    get = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    arrays = arrays or {}
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    scaling_type = get("rope.scaling.type", "none")
    rope_scaling = None
    if scaling_type != "none":
        rope_scaling = {"rope_type": scaling_type, "factor": get("rope.scaling.factor")}
    rope_freqs = arrays.get(ROPE_FREQS)
    embed = arrays.get("token_embd.weight")
    vocab = embed.shape[0] if embed is not None else get("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=get("attention.key_length") or get("rope.dimension_count") or hidden // heads,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        rope_freq_factors=None if rope_freqs is None else tuple(float(x) for x in np.asarray(rope_freqs)),
        max_position_embeddings=get("context_length", 2048),
        tie_word_embeddings="output.weight" not in arrays if arrays else False,
        sliding_window=get("attention.sliding_window"),
        attention_bias="blk.0.attn_q.bias" in arrays,
        attention_out_bias="blk.0.attn_output.bias" in arrays,
        model_type=GGUF_MODEL_TYPES[arch],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def tensors_from_gguf(cfg: LlamaConfig, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF arrays ([out, in] numpy order) -> HF-named tensors; llama files store q/k rows permuted for
    llama.cpp's interleaved RoPE (qwen2 files do not)."""
    from mia_jax.models.gguf_io import rename

    tensors = rename(arrays, GGUF_TO_HF, cfg.model_type)
    tensors.pop(ROPE_FREQS, None)
    if cfg.model_type == "llama":
        for i in range(cfg.num_hidden_layers):
            for proj, heads in (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads)):
                name = f"model.layers.{i}.self_attn.{proj}_proj.weight"
                if name in tensors:
                    tensors[name] = L.apply(tensors[name], lambda w, h=heads: unpermute_qk(w, h))
    return tensors

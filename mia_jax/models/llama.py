"""Llama-family causal LM (SmolLM2, Llama 1/2/3, Mistral) in Flax NNX.

Decoder layers are stored stacked on a leading layer axis and applied with `jax.lax.scan`, so compile
time does not grow with depth. Weight layouts are `[in, out]` (heads kept as their own axis);
`params_from_hf` converts a Hugging Face state dict to them.
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

from mia_jax.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
SUPPORTED_ROPE_SCALING = (None, "linear", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class ConfigError(UserError, ValueError):
    """A model config this implementation does not support."""


def _check_model_type(model_type):
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    return model_type


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama-family model (Hugging Face names; `from_hf` reads a config.json)."""

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
        rope_type = (self.rope_scaling or {}).get("rope_type")
        if rope_type not in SUPPORTED_ROPE_SCALING:
            raise ConfigError(
                f"unsupported rope_scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_SCALING}"
            )

    def __hash__(self):  # rope_scaling is a dict; nnx graphdefs hash their static attributes
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=str))

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "LlamaConfig":
        """From a Hugging Face `config.json` dict (rope given as rope_theta/rope_scaling or rope_parameters)."""
        model_type = _check_model_type(hf.get("model_type"))
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag):
                raise ConfigError(f"{flag}=True is not supported by the Llama implementation")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is implemented")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        first = lambda v: v[0] if isinstance(v, (list, tuple)) else v  # noqa: E731  (llama 3 lists several eos)
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads"),
            head_dim=hf.get("head_dim"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            sliding_window=hf.get("sliding_window"),
            model_type=model_type,
            bos_token_id=first(hf.get("bos_token_id")),
            eos_token_id=first(hf.get("eos_token_id")),
            pad_token_id=first(hf.get("pad_token_id")),
        )


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """Inverse RoPE frequencies [head_dim/2] (float32), following transformers' rope_type formulas."""
    dim = cfg.head_dim
    inv = (1.0 / cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)).astype(np.float32)
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type") == "linear":
        inv = inv / sc["factor"]
    elif sc.get("rope_type") == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    if cfg.rope_freq_factors is not None:
        inv = inv / np.asarray(cfg.rope_freq_factors, np.float32)
    return inv.astype(np.float32)


def rms_norm(x, weight, eps):
    """RMSNorm computed in float32, returned in the input dtype (as transformers does)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def apply_rope(x, cos, sin):
    """x [B, T, H, Dh]; cos/sin [T, Dh] float32 (rotate-half convention)."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).astype(x.dtype)


def causal_mask(t: int, sliding_window: int | None):
    """[T, T] bool: query i sees key j when j <= i (and i - j < sliding_window when set)."""
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    mask = j <= i
    return mask if sliding_window is None else mask & (i - j < sliding_window)


def _init(rngs, shape, dtype, fan_in):
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype))


class DecoderLayers(nnx.Module):
    """All decoder layers; every parameter has a leading [num_hidden_layers] axis."""

    def __init__(self, cfg: LlamaConfig, dtype, rngs: nnx.Rngs):
        L, D, F = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
        H, KV, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.attn_norm = nnx.Param(jnp.ones((L, D), dtype))
        self.wq = _init(rngs, (L, D, H, Dh), dtype, D)
        self.wk = _init(rngs, (L, D, KV, Dh), dtype, D)
        self.wv = _init(rngs, (L, D, KV, Dh), dtype, D)
        self.wo = _init(rngs, (L, H, Dh, D), dtype, H * Dh)
        self.mlp_norm = nnx.Param(jnp.ones((L, D), dtype))
        self.w_gate = _init(rngs, (L, D, F), dtype, D)
        self.w_up = _init(rngs, (L, D, F), dtype, D)
        self.w_down = _init(rngs, (L, F, D), dtype, F)

    def __call__(self, x, cfg: LlamaConfig, cos, sin, mask):
        params = {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}
        x, _ = jax.lax.scan(lambda h, p: (_layer(cfg, p, h, cos, sin, mask), None), x, params)
        return x


def _layer(cfg: LlamaConfig, p, x, cos, sin, mask):
    """One pre-norm decoder layer: x + attn(norm(x)), then + swiglu(norm(x))."""
    B, T, _ = x.shape
    KV, Dh = cfg.num_key_value_heads, cfg.head_dim
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q = apply_rope(jnp.einsum("btd,dhk->bthk", h, p["wq"]), cos, sin)
    k = apply_rope(jnp.einsum("btd,dhk->bthk", h, p["wk"]), cos, sin)
    v = jnp.einsum("btd,dhk->bthk", h, p["wv"])
    q = q.reshape(B, T, KV, -1, Dh)  # query heads grouped by their kv head
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(Dh)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    attn = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, -1, Dh)
    x = x + jnp.einsum("bthk,hkd->btd", attn, p["wo"])
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    gate = jax.nn.silu(h @ p["w_gate"])
    return x + (gate * (h @ p["w_up"])) @ p["w_down"]


class Llama(nnx.Module):
    """Llama-family causal LM. No attention mask: batches are right-padded, attention is causal."""

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
        self.lm_head = None if config.tie_word_embeddings else _init(rngs, (V, D), dt, D)

    def hidden_states(self, input_ids):
        """int [B, T] -> final-norm hidden states [B, T, D] (parameter dtype)."""
        T = input_ids.shape[1]
        angles = jnp.arange(T, dtype=jnp.float32)[:, None] * jnp.asarray(rope_inv_freq(self.config))[None]
        angles = jnp.concatenate([angles, angles], axis=-1)
        mask = causal_mask(T, self.config.sliding_window)
        x = jnp.take(self.embed[...], input_ids, axis=0)
        x = self.layers(x, self.config, jnp.cos(angles), jnp.sin(angles), mask)
        return rms_norm(x, self.norm[...], self.config.rms_norm_eps)

    def unembedding(self):
        """[V, D]: the lm_head weight, or the token embedding when tied."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids):
        """int [B, T] -> float32 logits [B, T, V]."""
        h = self.hidden_states(input_ids)
        return jnp.einsum("btd,vd->btv", h, self.unembedding(), preferred_element_type=jnp.float32)


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

    def get(name):
        if name not in tensors:
            raise UserError(f"checkpoint is missing tensor {name!r}")
        return np.asarray(tensors[name], np.float32)

    layers = {
        key: np.stack([conv(get(f"model.layers.{i}.{hf}")) for i in range(cfg.num_hidden_layers)])
        for key, (hf, conv) in layer_table.items()
    }
    out = {"embed": get("model.embed_tokens.weight"), "layers": layers, "norm": get("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight")
    return out


def from_params(cfg: LlamaConfig, params: dict, dtype: str = "float32") -> Llama:
    """Build a `Llama` holding `params` (from `params_from_hf`) without random initialisation."""
    abstract = nnx.eval_shape(lambda: Llama(cfg, dtype))
    graphdef, state = nnx.split(abstract)
    expected = nnx.to_pure_dict(state)
    dt = DTYPES[dtype]

    def convert(path, spec, value):
        if tuple(spec.shape) != value.shape:
            raise UserError(f"tensor {'/'.join(map(str, path))} has shape {value.shape}, expected {spec.shape}")
        return jnp.asarray(value, dt)

    pure = jax.tree_util.tree_map_with_path(convert, expected, params)
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)

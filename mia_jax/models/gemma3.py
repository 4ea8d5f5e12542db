"""Gemma 3 text model (Gemma-3-270m ... 27b language backbone) in Flax NNX.

Differences from Llama (whose RoPE, masks and grouped-query attention core it reuses):
interleaved local (sliding-window) and global attention layers, each with its own RoPE base
(`rope_local_base_freq` 10k, `rope_theta` 1M with its rope_scaling); RMSNorm on q and k; norms before
*and after* attention and MLP; Gemma RMSNorm scales by (1 + weight) in float32; the embedding is
multiplied by sqrt(hidden_size) rounded to the parameter dtype; scores are scaled by
query_pre_attn_scalar**-0.5; a GeGLU MLP with tanh-approximated GELU.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.models import layers as L
from mia_jax.models.layers import (
    DTYPES, ConfigError, apply_rope, build_module, causal_mask, gqa_attention, init_param, inv_freq, rope_at,
    rope_tables, scan_layers,
)
from mia_jax.models.llama import check_layer_types, check_rope_scaling, first_id

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
class Gemma3Config:
    """Hyper-parameters of a Gemma 3 text model (Hugging Face names; `from_hf` reads a config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
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
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads}")
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
            bos_token_id=first_id(hf.get("bos_token_id", 2)),
            eos_token_id=first_id(hf.get("eos_token_id", 1)),
            pad_token_id=first_id(hf.get("pad_token_id", 0)),
        )


def gemma_rms_norm(x, weight, eps):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), all in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


class Gemma3Layers(nnx.Module):
    """All decoder layers; every parameter has a leading [num_hidden_layers] axis. Norm weights are stored
    as Gemma stores them (zero-centred: the scale is 1 + weight)."""

    def __init__(self, cfg: Gemma3Config, dtype, rngs: nnx.Rngs):
        n, D, F = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
        H, KV, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        zeros = lambda *shape: nnx.Param(jnp.zeros((n, *shape), dtype))  # noqa: E731
        self.attn_norm = zeros(D)
        self.wq = init_param(rngs, (n, D, H, Dh), dtype, D)
        self.wk = init_param(rngs, (n, D, KV, Dh), dtype, D)
        self.wv = init_param(rngs, (n, D, KV, Dh), dtype, D)
        self.q_norm = zeros(Dh)
        self.k_norm = zeros(Dh)
        self.wo = init_param(rngs, (n, H, Dh, D), dtype, H * Dh)
        self.post_attn_norm = zeros(D)
        self.mlp_norm = zeros(D)
        self.w_gate = init_param(rngs, (n, D, F), dtype, D)
        self.w_up = init_param(rngs, (n, D, F), dtype, D)
        self.w_down = init_param(rngs, (n, F, D), dtype, F)
        self.post_mlp_norm = zeros(D)

    def __call__(self, x, cfg: Gemma3Config, rope_global, rope_local, full_mask, window_mask):
        def layer(p, h, local):
            cos, sin = (jnp.where(local, a, b) for a, b in zip(rope_local, rope_global))
            return _layer(cfg, p, h, cos, sin, jnp.where(local, window_mask, full_mask))

        return scan_layers(self, layer, x, jnp.asarray(cfg.sliding_layers()))

    def decode(self, x, cfg: Gemma3Config, rope_global, rope_local, cache: dict, full_mask, window_mask):
        """New tokens x [B, T, D] against the KV cache (masks [B, T, S]) -> (x, cache)."""
        def layer(p, h, local):
            cos, sin = (jnp.where(local, a, b) for a, b in zip(rope_local, rope_global))
            q, k, v = _attention_inputs(cfg, p, h, cos, sin)
            mask = jnp.where(local, window_mask, full_mask)
            return q, k, v, mask, cfg.query_pre_attn_scalar ** -0.5, lambda attn: _attention_output(cfg, p, h, attn)

        return L.scan_with_cache(L.stacked_params(self), layer, x, jnp.asarray(cfg.sliding_layers()), cache)


def _attention_inputs(cfg: Gemma3Config, p, x, cos, sin):
    """q [B, T, H, Dh] and k, v [B, T, KV, Dh] of one layer (q/k normed, RoPE applied)."""
    eps = cfg.rms_norm_eps
    h = gemma_rms_norm(x, p["attn_norm"], eps)
    q = apply_rope(gemma_rms_norm(jnp.einsum("btd,dhk->bthk", h, p["wq"]), p["q_norm"], eps), cos, sin)
    k = apply_rope(gemma_rms_norm(jnp.einsum("btd,dhk->bthk", h, p["wk"]), p["k_norm"], eps), cos, sin)
    return q, k, jnp.einsum("btd,dhk->bthk", h, p["wv"])


def _layer(cfg: Gemma3Config, p, x, cos, sin, mask):
    q, k, v = _attention_inputs(cfg, p, x, cos, sin)
    return _attention_output(cfg, p, x, gqa_attention(q, k, v, mask, cfg.query_pre_attn_scalar ** -0.5))


def _attention_output(cfg: Gemma3Config, p, x, attn):
    """Output projection with its post-norm and residual, then the GeGLU MLP with its pre- and post-norms."""
    eps = cfg.rms_norm_eps
    x = x + gemma_rms_norm(jnp.einsum("bthk,hkd->btd", attn, p["wo"]), p["post_attn_norm"], eps)
    h = gemma_rms_norm(x, p["mlp_norm"], eps)
    gate = jax.nn.gelu((h @ p["w_gate"]).astype(jnp.float32), approximate=True).astype(h.dtype)
    return x + gemma_rms_norm((gate * (h @ p["w_up"])) @ p["w_down"], p["post_mlp_norm"], eps)


class Gemma3(nnx.Module):
    """Gemma 3 causal LM (text). `__call__` / `hidden_states` take no attention mask (batches are right-padded,
    attention is causal); `decode` runs new tokens against a KV cache with per-row positions and a key mask."""

    def __init__(self, config: Gemma3Config, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        if dtype not in DTYPES:
            raise ConfigError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.dtype = dtype
        dt = DTYPES[dtype]
        V, D = config.vocab_size, config.hidden_size
        self.embed = nnx.Param((jax.random.normal(rngs.params(), (V, D)) * 0.02).astype(dt))
        self.layers = Gemma3Layers(config, dt, rngs)
        self.norm = nnx.Param(jnp.zeros((D,), dt))
        self.lm_head = None if config.tie_word_embeddings else init_param(rngs, (V, D), dt, D)

    def _inv_freqs(self):
        cfg = self.config
        return (inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
                inv_freq(cfg.head_dim, cfg.rope_local_base_freq, cfg.rope_local_scaling))

    def _embed(self, input_ids):
        embed = self.embed[...]
        return jnp.take(embed, input_ids, axis=0) * jnp.asarray(self.config.hidden_size ** 0.5, embed.dtype)

    def hidden_states(self, input_ids):
        """int [B, T] -> final-norm hidden states [B, T, D] (parameter dtype)."""
        cfg, T = self.config, input_ids.shape[1]
        inv_global, inv_local = self._inv_freqs()
        x = self.layers(self._embed(input_ids), cfg, rope_tables(T, inv_global), rope_tables(T, inv_local),
                        causal_mask(T, None), causal_mask(T, cfg.sliding_window))
        return gemma_rms_norm(x, self.norm[...], cfg.rms_norm_eps)

    def unembedding(self):
        """[V, D]: the token embedding (tied) or the lm_head weight."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids):
        """int [B, T] -> float32 logits [B, T, V]."""
        h = self.hidden_states(input_ids)
        return jnp.einsum("btd,vd->btv", h, self.unembedding(), preferred_element_type=jnp.float32)

    def init_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `decode` (every layer, sliding or global, keeps max_len slots)."""
        cfg = self.config
        return L.init_cache(cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim,
                            self.embed[...].dtype)

    def decode(self, input_ids, cache: dict, positions, key_mask):
        """Incremental forward (see `Llama.decode`): ids [B, T], positions [B, T], key_mask [B, S]
        -> (float32 logits [B, T, V], cache)."""
        cfg = self.config
        inv_global, inv_local = self._inv_freqs()
        full, window = L.cache_masks(cache, input_ids.shape[1], key_mask, cfg.sliding_window)
        x, cache = self.layers.decode(self._embed(input_ids), cfg, rope_at(positions, inv_global),
                                      rope_at(positions, inv_local), cache, full, window)
        return L.unembed(gemma_rms_norm(x, self.norm[...], cfg.rms_norm_eps), self.unembedding()), cache


# checkpoint name prefixes of the text model: Gemma3ForCausalLM, Gemma3ForConditionalGeneration (new and old)
_PREFIXES = (("model.", "lm_head."), ("model.language_model.", "lm_head."),
             ("language_model.model.", "language_model.lm_head."))


def params_from_hf(cfg: Gemma3Config, tensors: Mapping[str, np.ndarray]) -> dict:
    """A Hugging Face Gemma 3 state dict (numpy, [out, in] weights) -> nested dict matching `Gemma3`'s state."""
    D, H, KV, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    base, head = next((p for p in _PREFIXES if p[0] + "embed_tokens.weight" in tensors), _PREFIXES[0])
    same = lambda w: w  # noqa: E731
    layer_table = {
        "attn_norm": ("input_layernorm.weight", same),
        "wq": ("self_attn.q_proj.weight", lambda w: w.T.reshape(D, H, Dh)),
        "wk": ("self_attn.k_proj.weight", lambda w: w.T.reshape(D, KV, Dh)),
        "wv": ("self_attn.v_proj.weight", lambda w: w.T.reshape(D, KV, Dh)),
        "q_norm": ("self_attn.q_norm.weight", same),
        "k_norm": ("self_attn.k_norm.weight", same),
        "wo": ("self_attn.o_proj.weight", lambda w: w.T.reshape(H, Dh, D)),
        "post_attn_norm": ("post_attention_layernorm.weight", same),
        "mlp_norm": ("pre_feedforward_layernorm.weight", same),
        "w_gate": ("mlp.gate_proj.weight", lambda w: w.T),
        "w_up": ("mlp.up_proj.weight", lambda w: w.T),
        "w_down": ("mlp.down_proj.weight", lambda w: w.T),
        "post_mlp_norm": ("post_feedforward_layernorm.weight", same),
    }

    get = L.Tensors(tensors, ("",), base + "embed_tokens.weight", "Gemma 3")
    out = {"embed": get.lazy(base + "embed_tokens.weight"), "layers": get.stack(layer_table, cfg.num_hidden_layers,
           base + "layers.{i}."), "norm": get.lazy(base + "norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get.lazy(head + "weight")
    return out


def from_params(cfg: Gemma3Config, params: dict, dtype: str = "float32", place=None) -> Gemma3:
    """Build a `Gemma3` holding `params` (from `params_from_hf`) without random initialisation."""
    return build_module(Gemma3, cfg, params, dtype, place)


# GGUF tensor name -> Hugging Face name ("{i}" is the layer index), as llama.cpp's Gemma3Model writes them.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> Gemma3Config:
    """`Gemma3Config` from `gemma3.*` metadata. A GGUF records neither the layer pattern nor the local RoPE base
    nor query_pre_attn_scalar; llama.cpp (and transformers' GGUF loader) use every-6th-global, 10k and head_dim."""
    get = lambda key, default=None: meta.get(f"gemma3.{key}", default)  # noqa: E731
    arrays = arrays or {}
    heads, hidden = get("attention.head_count"), get("embedding_length")
    head_dim = get("attention.key_length") or hidden // heads
    embed = arrays.get("token_embd.weight")
    vocab = embed.shape[0] if embed is not None else get("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    layers = get("block_count")
    pattern = get("attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
    rope_scaling = None
    if get("rope.scaling.type", "none") != "none":
        rope_scaling = {"rope_type": get("rope.scaling.type"), "factor": get("rope.scaling.factor")}
    return Gemma3Config(
        vocab_size=int(vocab),
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
        rope_scaling=rope_scaling,
        # llama.cpp: 1/sqrt(hidden/heads) for the 62-layer 27B model, 1/sqrt(head_dim) otherwise
        query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim),
        max_position_embeddings=get("context_length", 131072),
        tie_word_embeddings="output.weight" not in arrays,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def tensors_from_gguf(cfg: Gemma3Config, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF arrays ([out, in] numpy order) -> HF-named tensors; llama.cpp stores Gemma's norm weights as
    1 + weight (convert_hf_to_gguf.py), undone here."""
    from mia_jax.models.gguf_io import rename

    tensors = rename(arrays, GGUF_TO_HF, "gemma3")
    return {name: (L.apply(a, lambda w: w - 1.0) if name.endswith("norm.weight") else a) for name, a in tensors.items()}

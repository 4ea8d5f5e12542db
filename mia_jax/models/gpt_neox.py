"""GPT-NeoX / Pythia causal LM in Flax NNX (parallel or sequential residual, partial rotary embeddings).

Layers are stacked on a leading axis and applied with `jax.lax.scan`. Weights are `[in, out]` with heads
as their own axis; the fused query_key_value projection keeps transformers' per-head layout [H, 3, Dh].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.models import layers as L
from mia_jax.models.layers import ConfigError, apply_rope

MODEL_TYPE = "gpt_neox"


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 2048
    rotary_pct: float = 0.25
    rotary_emb_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    use_parallel_residual: bool = True
    hidden_act: str = "gelu"
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    model_type: str = MODEL_TYPE
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type {self.model_type!r} is not {MODEL_TYPE!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} is not a multiple of "
                              f"num_attention_heads={self.num_attention_heads}")
        L.check_activation("hidden_act", self.hidden_act)
        if self.rotary_ndims % 2:
            raise ConfigError(f"rotary_pct={self.rotary_pct} gives an odd rotary dimension {self.rotary_ndims}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "GPTNeoXConfig":
        """From a config.json dict (rotary as rope_parameters, rope_scaling or rotary_pct/rotary_emb_base)."""
        if hf.get("model_type") != MODEL_TYPE:
            raise ConfigError(f"unsupported model_type {hf.get('model_type')!r} for GPT-NeoX")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"unsupported rope_parameters rope_type {rope_type!r} for GPT-NeoX; only 'default'")
        if hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
            raise ConfigError(f"head_dim={hf['head_dim']} != hidden_size / num_attention_heads is not supported")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rotary_pct=float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))),
            rotary_emb_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            use_parallel_residual=bool(hf.get("use_parallel_residual", True)),
            hidden_act=hf.get("hidden_act", "gelu"),
            attention_bias=bool(hf.get("attention_bias", True)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )


def _attention_inputs(cfg: GPTNeoXConfig, p, x, cos, sin):
    """q, k, v [B, T, H, Dh] of one layer (rotary on the first rotary_ndims of each head)."""
    rd = cfg.rotary_ndims

    def rope(t):
        return t if rd == 0 else jnp.concatenate([apply_rope(t[..., :rd], cos, sin), t[..., rd:]], axis=-1)

    h = L.layer_norm(x, p["ln1"], p["ln1_b"], cfg.layer_norm_eps)
    qkv = jnp.einsum("btd,dhck->bthck", h, p["w_qkv"]) + p["b_qkv"]
    return rope(qkv[..., 0, :]), rope(qkv[..., 1, :]), qkv[..., 2, :]


def _attention_output(cfg: GPTNeoXConfig, p, x, attn):
    """Dense projection, then the parallel (or sequential) residual with the MLP."""
    eps = cfg.layer_norm_eps

    def mlp(h):
        h = L.mlp_activation(cfg.hidden_act, h @ p["w_up"] + p["b_up"])
        return h @ p["w_down"] + p["b_down"]

    attn = jnp.einsum("bthk,hkd->btd", attn, p["w_o"]) + p["b_o"]
    if cfg.use_parallel_residual:
        return x + attn + mlp(L.layer_norm(x, p["ln2"], p["ln2_b"], eps))
    x = x + attn
    return x + mlp(L.layer_norm(x, p["ln2"], p["ln2_b"], eps))


def _layer(cfg: GPTNeoXConfig, p, x, cos, sin):
    q, k, v = _attention_inputs(cfg, p, x, cos, sin)
    return _attention_output(cfg, p, x, L.causal_attention(q, k, v, cfg.head_dim ** -0.5))


class GPTNeoX(nnx.Module):
    """GPT-NeoX causal LM. `__call__` / `hidden_states` take no attention mask (batches are right-padded,
    attention is causal); `decode` runs new tokens against a KV cache (left-padded generation)."""

    def __init__(self, config: GPTNeoXConfig, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        dt = L.check_dtype(dtype)
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config, self.dtype = config, dtype
        V, D, F = config.vocab_size, config.hidden_size, config.intermediate_size
        H, Dh = config.num_attention_heads, config.head_dim
        shapes = {"ln1": (D,), "ln1_b": (D,), "w_qkv": (D, H, 3, Dh), "b_qkv": (H, 3, Dh), "w_o": (H, Dh, D),
                  "b_o": (D,), "ln2": (D,), "ln2_b": (D,), "w_up": (D, F), "b_up": (F,), "w_down": (F, D),
                  "b_down": (D,)}
        self.embed = L.normal_param(rngs, (V, D), dt)
        self.layers = L.StackedLayers(config.num_hidden_layers, shapes, dt, rngs)
        self.final_norm = nnx.Param(jnp.ones((D,), dt))
        self.final_norm_b = nnx.Param(jnp.zeros((D,), dt))
        self.lm_head = None if config.tie_word_embeddings else L.normal_param(rngs, (V, D), dt)

    def _inv_freq(self):
        rd = self.config.rotary_ndims
        return 1.0 / self.config.rotary_emb_base ** (np.arange(0, rd, 2, dtype=np.float32) / max(rd, 1))

    def hidden_states(self, input_ids):
        """int [B, T] -> final-norm hidden states [B, T, D] (parameter dtype)."""
        cfg, T = self.config, input_ids.shape[1]
        cos, sin = L.rope_tables(T, self._inv_freq())
        x = jnp.take(self.embed[...], input_ids, axis=0)
        x = self.layers.scan(lambda p, h, _: _layer(cfg, p, h, cos, sin), x)
        return L.layer_norm(x, self.final_norm[...], self.final_norm_b[...], cfg.layer_norm_eps)

    def unembedding(self):
        """[V, D]: embed_out, or the input embedding when tied."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids):
        """int [B, T] -> float32 logits [B, T, V] (all rows, including padded vocabulary rows)."""
        return L.unembed(self.hidden_states(input_ids), self.unembedding())

    def init_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `decode`: k, v [L, B, max_len, H, Dh] and the next slot, `index`."""
        cfg = self.config
        return L.init_cache(cfg.num_hidden_layers, batch, max_len, cfg.num_attention_heads, cfg.head_dim,
                            self.embed[...].dtype)

    def decode(self, input_ids, cache: dict, positions, key_mask):
        """Incremental forward (see `Llama.decode`): ids [B, T], positions [B, T], key_mask [B, S]
        -> (float32 logits [B, T, V], cache)."""
        cfg = self.config
        cos, sin = L.rope_at(positions, self._inv_freq())
        mask, _ = L.cache_masks(cache, input_ids.shape[1], key_mask)

        def layer(p, h, _):
            q, k, v = _attention_inputs(cfg, p, h, cos, sin)
            return q, k, v, mask, cfg.head_dim ** -0.5, lambda attn: _attention_output(cfg, p, h, attn)

        x, cache = self.layers.scan_cached(layer, jnp.take(self.embed[...], input_ids, axis=0), None, cache)
        x = L.layer_norm(x, self.final_norm[...], self.final_norm_b[...], cfg.layer_norm_eps)
        return L.unembed(x, self.unembedding()), cache


def params_from_hf(cfg: GPTNeoXConfig, tensors: Mapping[str, np.ndarray]) -> dict:
    """A Hugging Face GPT-NeoX state dict (numpy, [out, in] Linear weights) -> nested dict matching `GPTNeoX`."""
    D, H, Dh, F = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size
    get = L.Tensors(tensors, ("gpt_neox.", ""), "embed_in.weight", "GPT-NeoX")
    bias = (lambda name, shape: get.lazy(name).then(lambda b: b.reshape(shape))) if cfg.attention_bias else (
        lambda name, shape: L.lazy(np.zeros(shape, np.float32)))
    table = {  # internal name -> (HF name inside layers.{i}., conversion)
        "ln1": ("input_layernorm.weight", lambda w: w),
        "ln1_b": ("input_layernorm.bias", lambda w: w),
        "w_qkv": ("attention.query_key_value.weight", lambda w: w.T.reshape(D, H, 3, Dh)),
        "w_o": ("attention.dense.weight", lambda w: w.T.reshape(H, Dh, D)),
        "ln2": ("post_attention_layernorm.weight", lambda w: w),
        "ln2_b": ("post_attention_layernorm.bias", lambda w: w),
        "w_up": ("mlp.dense_h_to_4h.weight", lambda w: w.T),
        "b_up": ("mlp.dense_h_to_4h.bias", lambda w: w),
        "w_down": ("mlp.dense_4h_to_h.weight", lambda w: w.T),
        "b_down": ("mlp.dense_4h_to_h.bias", lambda w: w),
    }
    layers = get.stack(table, cfg.num_hidden_layers, "layers.{i}.")
    fmt = "layers.{i}.attention."
    layers["b_qkv"] = L.stack_layers([bias(fmt.format(i=i) + "query_key_value.bias", (H, 3, Dh))
                                      for i in range(cfg.num_hidden_layers)])
    layers["b_o"] = L.stack_layers([bias(fmt.format(i=i) + "dense.bias", (D,)) for i in range(cfg.num_hidden_layers)])
    out = {"embed": get.lazy("embed_in.weight"), "layers": layers,
           "final_norm": get.lazy("final_layer_norm.weight"), "final_norm_b": get.lazy("final_layer_norm.bias")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get.lazy("embed_out.weight" if "embed_out.weight" in tensors else "lm_head.weight",
                                  absolute=True)
    return out


def from_params(cfg: GPTNeoXConfig, params: dict, dtype: str = "float32", place=None) -> GPTNeoX:
    """Build a `GPTNeoX` holding `params` (from `params_from_hf`) without random initialisation."""
    return L.build_module(GPTNeoX, cfg, params, dtype, place)


# ---- GGUF (llama.cpp architecture "gptneox") ----
GGUF_ARCH = "gptneox"
GGUF_TO_HF = {
    "token_embd.weight": "gpt_neox.embed_in.weight",
    "output_norm.weight": "gpt_neox.final_layer_norm.weight",
    "output_norm.bias": "gpt_neox.final_layer_norm.bias",
    "output.weight": "embed_out.weight",
    **{f"blk.{{i}}.{g}.{s}": f"gpt_neox.layers.{{i}}.{h}.{s}" for g, h in [
        ("attn_norm", "input_layernorm"), ("attn_qkv", "attention.query_key_value"),
        ("attn_output", "attention.dense"), ("ffn_norm", "post_attention_layernorm"),
        ("ffn_up", "mlp.dense_h_to_4h"), ("ffn_down", "mlp.dense_4h_to_h")] for s in ("weight", "bias")},
}


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> GPTNeoXConfig:
    """`GPTNeoXConfig` from `gptneox.*` metadata (vocabulary size from token_embd when `arrays` is given)."""
    get = L.gguf_getter(meta)
    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = hidden // heads
    rotary_ndims = get("rope.dimension_count", head_dim)
    rotary_pct = rotary_ndims / head_dim
    if int(head_dim * rotary_pct) != rotary_ndims:  # keep int(head_dim * pct) == the stored count
        rotary_pct = float(np.nextafter(rotary_pct, 2.0))
    return GPTNeoXConfig(
        vocab_size=L.gguf_vocab_size(meta, arrays),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length", 4 * hidden),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        max_position_embeddings=get("context_length", 2048),
        rotary_pct=rotary_pct,
        rotary_emb_base=float(get("rope.freq_base", 10000.0)),
        layer_norm_eps=float(get("attention.layer_norm_epsilon", 1e-5)),
        use_parallel_residual=bool(get("use_parallel_residual", True)),
        tie_word_embeddings=arrays is not None and "output.weight" not in arrays,
        **L.gguf_special_ids(meta),
    )


def tensors_from_gguf(cfg: GPTNeoXConfig, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF arrays ([out, in] numpy order) -> HF-named tensors; undoes convert_hf_to_gguf.py's q/k/v regrouping
    of query_key_value (GGUF rows are [3, H, Dh], HF rows [H, 3, Dh])."""
    H, Dh = cfg.num_attention_heads, cfg.head_dim
    from mia_jax.models.gguf_io import rename

    out = rename(arrays, GGUF_TO_HF, GGUF_ARCH)
    for name in list(out):
        if name.endswith("query_key_value.weight") or name.endswith("query_key_value.bias"):
            out[name] = L.apply(out[name], lambda a: a.reshape(3, H, Dh, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape))
    return out

"""OPT causal LM in Flax NNX (learned positions with offset 2, pre- or post-LayerNorm, optional
project_in/project_out when word_embed_proj_dim != hidden_size, tied lm_head by default).

Layers are stacked on a leading axis and applied with `jax.lax.scan`; weights are `[in, out]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.models import layers as L
from mia_jax.models.layers import ConfigError

MODEL_TYPE = "opt"
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row = position + 2
LAYER_NORM_EPS = 1e-5  # transformers' nn.LayerNorm default; OPT has no config option for it


@dataclasses.dataclass(frozen=True)
class OPTConfig:
    vocab_size: int
    hidden_size: int
    ffn_dim: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 2048
    word_embed_proj_dim: int | None = None  # None = hidden_size (no project_in / project_out)
    do_layer_norm_before: bool = True
    remove_final_layer_norm: bool = False  # config.json `_remove_final_layer_norm`
    activation_function: str = "relu"
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True
    tie_word_embeddings: bool = True
    model_type: str = MODEL_TYPE
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type {self.model_type!r} is not {MODEL_TYPE!r}")
        if self.word_embed_proj_dim is None:
            object.__setattr__(self, "word_embed_proj_dim", self.hidden_size)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} is not a multiple of "
                              f"num_attention_heads={self.num_attention_heads}")
        L.check_activation("activation_function", self.activation_function)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def projected(self) -> bool:
        return self.word_embed_proj_dim != self.hidden_size

    @property
    def final_layer_norm(self) -> bool:
        return self.do_layer_norm_before and not self.remove_final_layer_norm

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "OPTConfig":
        """From a config.json dict."""
        if hf.get("model_type") != MODEL_TYPE:
            raise ConfigError(f"unsupported model_type {hf.get('model_type')!r} for OPT")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            ffn_dim=hf["ffn_dim"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            word_embed_proj_dim=hf.get("word_embed_proj_dim"),
            do_layer_norm_before=bool(hf.get("do_layer_norm_before", True)),
            remove_final_layer_norm=bool(hf.get("_remove_final_layer_norm", False)),
            activation_function=hf.get("activation_function", "relu"),
            enable_bias=bool(hf.get("enable_bias", True)),
            layer_norm_elementwise_affine=bool(hf.get("layer_norm_elementwise_affine", True)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )


def _attention_inputs(cfg: OPTConfig, p, x):
    """q (already scaled, as transformers does before the product), k, v [B, T, H, Dh] of one layer."""
    h = L.layer_norm(x, p["ln1"], p["ln1_b"], LAYER_NORM_EPS) if cfg.do_layer_norm_before else x
    proj = lambda name: jnp.einsum("btd,dhk->bthk", h, p[f"w_{name}"]) + p[f"b_{name}"]  # noqa: E731
    return proj("q") * jnp.asarray(cfg.head_dim ** -0.5, h.dtype), proj("k"), proj("v")


def _attention_output(cfg: OPTConfig, p, x, attn):
    pre = cfg.do_layer_norm_before
    ln1 = lambda t: L.layer_norm(t, p["ln1"], p["ln1_b"], LAYER_NORM_EPS)  # noqa: E731
    ln2 = lambda t: L.layer_norm(t, p["ln2"], p["ln2_b"], LAYER_NORM_EPS)  # noqa: E731
    x = x + jnp.einsum("bthk,hkd->btd", attn, p["w_o"]) + p["b_o"]
    x = x if pre else ln1(x)
    h = ln2(x) if pre else x
    h = L.mlp_activation(cfg.activation_function, h @ p["w_fc1"] + p["b_fc1"])
    x = x + h @ p["w_fc2"] + p["b_fc2"]
    return x if pre else ln2(x)


def _layer(cfg: OPTConfig, p, x):
    q, k, v = _attention_inputs(cfg, p, x)
    return _attention_output(cfg, p, x, L.causal_attention(q, k, v, 1.0))


class OPT(nnx.Module):
    """OPT causal LM. `__call__` / `hidden_states` take no attention mask: batches are right-padded, attention is
    causal, positions are arange(T) + 2 as transformers computes them for an all-ones attention mask. `decode`
    runs new tokens against a KV cache (left-padded generation; positions from each row's first real token)."""

    def __init__(self, config: OPTConfig, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        dt = L.check_dtype(dtype)
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config, self.dtype = config, dtype
        V, D, E, F = config.vocab_size, config.hidden_size, config.word_embed_proj_dim, config.ffn_dim
        H, Dh = config.num_attention_heads, config.head_dim
        shapes = {"ln1": (D,), "ln1_b": (D,), "ln2": (D,), "ln2_b": (D,), "w_o": (H, Dh, D), "b_o": (D,),
                  "w_fc1": (D, F), "b_fc1": (F,), "w_fc2": (F, D), "b_fc2": (D,)}
        for n in "qkv":
            shapes.update({f"w_{n}": (D, H, Dh), f"b_{n}": (H, Dh)})
        self.embed = L.normal_param(rngs, (V, E), dt)
        self.pos_embed = L.normal_param(rngs, (config.max_position_embeddings + POSITION_OFFSET, D), dt)
        self.project_in = L.normal_param(rngs, (E, D), dt) if config.projected else None
        self.layers = L.StackedLayers(config.num_hidden_layers, shapes, dt, rngs)
        self.final_norm = nnx.Param(jnp.ones((D,), dt)) if config.final_layer_norm else None
        self.final_norm_b = nnx.Param(jnp.zeros((D,), dt)) if config.final_layer_norm else None
        self.project_out = L.normal_param(rngs, (D, E), dt) if config.projected else None
        self.lm_head = None if config.tie_word_embeddings else L.normal_param(rngs, (V, E), dt)

    def _embed(self, input_ids, positions):
        x = jnp.take(self.embed[...], input_ids, axis=0)
        if self.project_in is not None:
            x = x @ self.project_in[...]
        return x + L.learned_positions(self.pos_embed[...], positions, POSITION_OFFSET)

    def _head(self, x):
        if self.final_norm is not None:
            x = L.layer_norm(x, self.final_norm[...], self.final_norm_b[...], LAYER_NORM_EPS)
        if self.project_out is not None:
            x = x @ self.project_out[...]
        return x

    def hidden_states(self, input_ids):
        """int [B, T] -> hidden states [B, T, word_embed_proj_dim] after the final norm and project_out."""
        cfg, T = self.config, input_ids.shape[1]
        L.check_length(T, cfg.max_position_embeddings, "OPT")
        x = self._embed(input_ids, jnp.arange(T)[None])
        return self._head(self.layers.scan(lambda p, h, _: _layer(cfg, p, h), x))

    def unembedding(self):
        """[V, word_embed_proj_dim]: embed_tokens when tied (the OPT default), else lm_head."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids):
        """int [B, T] -> float32 logits [B, T, V]."""
        return L.unembed(self.hidden_states(input_ids), self.unembedding())

    def init_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `decode`: k, v [L, B, max_len, H, Dh] and the next slot, `index`."""
        cfg = self.config
        return L.init_cache(cfg.num_hidden_layers, batch, max_len, cfg.num_attention_heads, cfg.head_dim,
                            self.embed[...].dtype)

    def decode(self, input_ids, cache: dict, positions, key_mask):
        """Incremental forward (see `Llama.decode`): ids [B, T], positions [B, T] (0 at a row's first real token;
        the table row is position + 2, as transformers computes it from an attention mask), key_mask [B, S]
        -> (float32 logits [B, T, V], cache)."""
        cfg = self.config
        mask, _ = L.cache_masks(cache, input_ids.shape[1], key_mask)

        def layer(p, h, _):
            q, k, v = _attention_inputs(cfg, p, h)
            return q, k, v, mask, 1.0, lambda attn: _attention_output(cfg, p, h, attn)

        x, cache = self.layers.scan_cached(layer, self._embed(input_ids, positions), None, cache)
        return L.unembed(self._head(x), self.unembedding()), cache


def params_from_hf(cfg: OPTConfig, tensors: Mapping[str, np.ndarray]) -> dict:
    """A Hugging Face OPT state dict ('model.decoder.' or 'decoder.' prefix, [out, in] Linear weights)
    -> nested dict matching `OPT`. Absent biases (enable_bias=False) and LayerNorm affines
    (layer_norm_elementwise_affine=False) become zeros / ones."""
    D, H, Dh, F = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.ffn_dim
    get = L.Tensors(tensors, ("model.decoder.", "decoder.", ""), "embed_tokens.weight", "OPT")
    n = cfg.num_hidden_layers
    same = lambda w: w  # noqa: E731
    heads_in = lambda w: w.T.reshape(D, H, Dh)  # noqa: E731
    table = {"w_q": ("self_attn.q_proj.weight", heads_in), "w_k": ("self_attn.k_proj.weight", heads_in),
             "w_v": ("self_attn.v_proj.weight", heads_in),
             "w_o": ("self_attn.out_proj.weight", lambda w: w.T.reshape(H, Dh, D)),
             "w_fc1": ("fc1.weight", lambda w: w.T), "w_fc2": ("fc2.weight", lambda w: w.T)}
    biases = {"b_q": ("self_attn.q_proj.bias", lambda w: w.reshape(H, Dh)),
              "b_k": ("self_attn.k_proj.bias", lambda w: w.reshape(H, Dh)),
              "b_v": ("self_attn.v_proj.bias", lambda w: w.reshape(H, Dh)),
              "b_o": ("self_attn.out_proj.bias", same), "b_fc1": ("fc1.bias", same), "b_fc2": ("fc2.bias", same)}
    norms = {"ln1": ("self_attn_layer_norm.weight", same), "ln1_b": ("self_attn_layer_norm.bias", same),
             "ln2": ("final_layer_norm.weight", same), "ln2_b": ("final_layer_norm.bias", same)}
    layers = get.stack(table, n, "layers.{i}.")
    shapes = {"b_q": (H, Dh), "b_k": (H, Dh), "b_v": (H, Dh), "b_o": (D,), "b_fc1": (F,), "b_fc2": (D,)}
    if cfg.enable_bias:
        layers.update(get.stack(biases, n, "layers.{i}."))
    else:
        layers.update({k: np.zeros((n, *s), np.float32) for k, s in shapes.items()})
    affine = cfg.layer_norm_elementwise_affine
    if affine:
        layers.update(get.stack(norms, n, "layers.{i}."))
    else:
        layers.update({k: (np.zeros if k.endswith("_b") else np.ones)((n, D), np.float32) for k in norms})
    transposed = lambda name: get.lazy(name).then(lambda w: w.T)  # noqa: E731
    out = {"embed": get.lazy("embed_tokens.weight"), "pos_embed": get.lazy("embed_positions.weight"),
           "layers": layers,
           "project_in": transposed("project_in.weight") if cfg.projected else None,
           "project_out": transposed("project_out.weight") if cfg.projected else None,
           "final_norm": None, "final_norm_b": None, "lm_head": None}
    if cfg.final_layer_norm:
        out["final_norm"] = get.lazy("final_layer_norm.weight") if affine else np.ones(D, np.float32)
        out["final_norm_b"] = get.lazy("final_layer_norm.bias") if affine else np.zeros(D, np.float32)
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get.lazy("lm_head.weight", absolute=True)
    return {k: v for k, v in out.items() if v is not None}


def from_params(cfg: OPTConfig, params: dict, dtype: str = "float32", place=None) -> OPT:
    """Build an `OPT` holding `params` (from `params_from_hf`) without random initialisation."""
    return L.build_module(OPT, cfg, params, dtype, place)

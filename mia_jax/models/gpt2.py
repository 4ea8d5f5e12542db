"""GPT-2 causal LM in Flax NNX (learned positions, fused c_attn, tied wte by default).

Layers are stacked on a leading axis and applied with `jax.lax.scan`. GPT-2's Conv1D weights are already
`[in, out]`; they are only reshaped to put heads on their own axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.models import layers as L
from mia_jax.models.layers import ConfigError

MODEL_TYPE = "gpt2"


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 1024
    intermediate_size: int | None = None  # n_inner; None = 4 * hidden_size
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True
    model_type: str = MODEL_TYPE
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type {self.model_type!r} is not {MODEL_TYPE!r}")
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.hidden_size)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} is not a multiple of "
                              f"num_attention_heads={self.num_attention_heads}")
        L.check_activation("activation_function", self.activation_function)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "GPT2Config":
        """From a config.json dict (GPT-2 names n_embd/n_layer/n_head/n_positions or the generic ones).

        `reorder_and_upcast_attn` only changes the precision of transformers' eager attention; scores are
        always float32 here, so it is accepted. Cross-attention (`add_cross_attention`) is not supported.
        """
        if hf.get("model_type") != MODEL_TYPE:
            raise ConfigError(f"unsupported model_type {hf.get('model_type')!r} for GPT-2")
        if hf.get("add_cross_attention"):
            raise ConfigError("add_cross_attention=True is not supported by the GPT-2 implementation")
        pick = lambda *keys, default=None: next((hf[k] for k in keys if hf.get(k) is not None), default)  # noqa: E731
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=pick("n_embd", "hidden_size"),
            num_hidden_layers=pick("n_layer", "num_hidden_layers"),
            num_attention_heads=pick("n_head", "num_attention_heads"),
            max_position_embeddings=pick("n_positions", "max_position_embeddings", default=1024),
            intermediate_size=pick("n_inner", "intermediate_size"),
            activation_function=hf.get("activation_function", "gelu_new"),
            layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
            scale_attn_weights=bool(hf.get("scale_attn_weights", True)),
            scale_attn_by_inverse_layer_idx=bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )


def attention_scales(cfg: GPT2Config) -> np.ndarray:
    """Per-layer attention score scale [L] (1/sqrt(Dh) if scale_attn_weights, / (i+1) if by layer index)."""
    base = cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
    div = np.arange(1, cfg.num_hidden_layers + 1) if cfg.scale_attn_by_inverse_layer_idx else 1.0
    return (base / np.broadcast_to(div, (cfg.num_hidden_layers,))).astype(np.float32)


def _attention_inputs(cfg: GPT2Config, p, x):
    """q, k, v [B, T, H, Dh] of one layer (fused c_attn)."""
    h = L.layer_norm(x, p["ln1"], p["ln1_b"], cfg.layer_norm_epsilon)
    qkv = jnp.einsum("btd,dchk->btchk", h, p["w_qkv"]) + p["b_qkv"]
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def _attention_output(cfg: GPT2Config, p, x, attn):
    x = x + jnp.einsum("bthk,hkd->btd", attn, p["w_o"]) + p["b_o"]
    h = L.layer_norm(x, p["ln2"], p["ln2_b"], cfg.layer_norm_epsilon)
    h = L.mlp_activation(cfg.activation_function, h @ p["w_fc"] + p["b_fc"])
    return x + h @ p["w_proj"] + p["b_proj"]


def _layer(cfg: GPT2Config, p, x, scale):
    q, k, v = _attention_inputs(cfg, p, x)
    return _attention_output(cfg, p, x, L.causal_attention(q, k, v, scale))


class GPT2(nnx.Module):
    """GPT-2 causal LM. `__call__` / `hidden_states` take no attention mask (batches are right-padded, attention
    is causal, positions arange(T)); `decode` runs new tokens against a KV cache (left-padded generation)."""

    def __init__(self, config: GPT2Config, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        dt = L.check_dtype(dtype)
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config, self.dtype = config, dtype
        V, D, F = config.vocab_size, config.hidden_size, config.intermediate_size
        H, Dh = config.num_attention_heads, config.head_dim
        shapes = {"ln1": (D,), "ln1_b": (D,), "w_qkv": (D, 3, H, Dh), "b_qkv": (3, H, Dh), "w_o": (H, Dh, D),
                  "b_o": (D,), "ln2": (D,), "ln2_b": (D,), "w_fc": (D, F), "b_fc": (F,), "w_proj": (F, D),
                  "b_proj": (D,)}
        self.embed = L.normal_param(rngs, (V, D), dt)
        self.pos_embed = L.normal_param(rngs, (config.max_position_embeddings, D), dt)
        self.layers = L.StackedLayers(config.num_hidden_layers, shapes, dt, rngs)
        self.final_norm = nnx.Param(jnp.ones((D,), dt))
        self.final_norm_b = nnx.Param(jnp.zeros((D,), dt))
        self.lm_head = None if config.tie_word_embeddings else L.normal_param(rngs, (V, D), dt)

    def hidden_states(self, input_ids):
        """int [B, T] -> ln_f hidden states [B, T, D] (parameter dtype)."""
        cfg, T = self.config, input_ids.shape[1]
        L.check_length(T, cfg.max_position_embeddings, "GPT-2")
        x = jnp.take(self.embed[...], input_ids, axis=0) + self.pos_embed[...][:T][None]
        x = self.layers.scan(lambda p, h, s: _layer(cfg, p, h, s), x, jnp.asarray(attention_scales(cfg)))
        return L.layer_norm(x, self.final_norm[...], self.final_norm_b[...], cfg.layer_norm_epsilon)

    def unembedding(self):
        """[V, D]: wte when tied (the GPT-2 default), else lm_head."""
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
        """Incremental forward (see `Llama.decode`): ids [B, T], positions [B, T] (0 at a row's first real
        token, as transformers' generate derives them from the attention mask), key_mask [B, S]
        -> (float32 logits [B, T, V], cache)."""
        cfg = self.config
        mask, _ = L.cache_masks(cache, input_ids.shape[1], key_mask)
        x = jnp.take(self.embed[...], input_ids, axis=0) + L.learned_positions(self.pos_embed[...], positions)

        def layer(p, h, scale):
            q, k, v = _attention_inputs(cfg, p, h)
            return q, k, v, mask, scale, lambda attn: _attention_output(cfg, p, h, attn)

        x, cache = self.layers.scan_cached(layer, x, jnp.asarray(attention_scales(cfg)), cache)
        x = L.layer_norm(x, self.final_norm[...], self.final_norm_b[...], cfg.layer_norm_epsilon)
        return L.unembed(x, self.unembedding()), cache


def params_from_hf(cfg: GPT2Config, tensors: Mapping[str, np.ndarray]) -> dict:
    """A Hugging Face GPT-2 state dict (Conv1D weights [in, out]; with or without the 'transformer.' prefix)
    -> nested dict matching `GPT2`."""
    D, H, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    get = L.Tensors(tensors, ("transformer.", ""), "wte.weight", "GPT-2")
    same = lambda w: w  # noqa: E731
    table = {  # internal name -> (HF name inside h.{i}., conversion)
        "ln1": ("ln_1.weight", same),
        "ln1_b": ("ln_1.bias", same),
        "w_qkv": ("attn.c_attn.weight", lambda w: w.reshape(D, 3, H, Dh)),
        "b_qkv": ("attn.c_attn.bias", lambda w: w.reshape(3, H, Dh)),
        "w_o": ("attn.c_proj.weight", lambda w: w.reshape(H, Dh, D)),
        "b_o": ("attn.c_proj.bias", same),
        "ln2": ("ln_2.weight", same),
        "ln2_b": ("ln_2.bias", same),
        "w_fc": ("mlp.c_fc.weight", same),
        "b_fc": ("mlp.c_fc.bias", same),
        "w_proj": ("mlp.c_proj.weight", same),
        "b_proj": ("mlp.c_proj.bias", same),
    }
    out = {"embed": get.lazy("wte.weight"), "pos_embed": get.lazy("wpe.weight"),
           "layers": get.stack(table, cfg.num_hidden_layers, "h.{i}."),
           "final_norm": get.lazy("ln_f.weight"), "final_norm_b": get.lazy("ln_f.bias")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get.lazy("lm_head.weight", absolute=True)
    return out


def from_params(cfg: GPT2Config, params: dict, dtype: str = "float32", place=None) -> GPT2:
    """Build a `GPT2` holding `params` (from `params_from_hf`) without random initialisation."""
    return L.build_module(GPT2, cfg, params, dtype, place)


# ---- GGUF (llama.cpp architecture "gpt2") ----
GGUF_ARCH = "gpt2"
GGUF_TO_HF = {
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
    **{f"blk.{{i}}.{g}.{s}": f"transformer.h.{{i}}.{h}.{s}" for g, h in [
        ("attn_norm", "ln_1"), ("attn_qkv", "attn.c_attn"), ("attn_output", "attn.c_proj"),
        ("ffn_norm", "ln_2"), ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")] for s in ("weight", "bias")},
}
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> GPT2Config:
    """`GPT2Config` from `gpt2.*` metadata (vocabulary size from token_embd when `arrays` is given).

    llama.cpp writes output.weight as a copy of token_embd for GPT-2, so the config is untied then."""
    get = L.gguf_getter(meta)
    hidden = get("embedding_length")
    return GPT2Config(
        vocab_size=L.gguf_vocab_size(meta, arrays),
        hidden_size=hidden,
        num_hidden_layers=get("block_count"),
        num_attention_heads=get("attention.head_count"),
        max_position_embeddings=get("context_length", 1024),
        intermediate_size=get("feed_forward_length", 4 * hidden),
        layer_norm_epsilon=float(get("attention.layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=arrays is None or "output.weight" not in arrays,
        **L.gguf_special_ids(meta),
    )


def tensors_from_gguf(cfg: GPT2Config, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF arrays ([out, in] numpy order) -> HF-named tensors; transposes the Conv1D weights back to [in, out]
    (convert_hf_to_gguf.py transposes them to Linear layout)."""
    from mia_jax.models.gguf_io import rename

    out = rename(arrays, GGUF_TO_HF, GGUF_ARCH)
    return {k: (L.apply(a, lambda w: w.T) if k.endswith(_CONV1D) else a) for k, a in out.items()}

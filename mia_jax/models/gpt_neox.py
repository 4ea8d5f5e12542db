"""GPT-NeoX / Pythia causal LM in Flax NNX: config, weight spec and block on the shared decoder
(`causal_lm.CausalLM`). Parallel or sequential residual, partial rotary embeddings (the first rotary_ndims of each
head), LayerNorms with biases. The fused query_key_value projection keeps transformers' per-head layout [H, 3, Dh]
(llama.cpp regroups its rows to [3, H, Dh]).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from mia_jax.models import layers as L
from mia_jax.models.causal_lm import CausalLM, plus
from mia_jax.models.layers import ConfigError, apply_rope
from mia_jax.models.tensors import GGUFMeta
from mia_jax.models.weights import WeightSpec, bias, embedding, linear, norm

MODEL_TYPE = "gpt_neox"


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig(L.MultiHeadConfig):
    """A GPT-NeoX (Pythia) config (the fields of its config.json this implementation reads)."""
    MODEL_TYPE, FAMILY, ACTIVATION = MODEL_TYPE, "GPT-NeoX", "hidden_act"

    intermediate_size: int
    max_position_embeddings: int = 2048
    rotary_pct: float = 0.25
    rotary_emb_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    use_parallel_residual: bool = True
    hidden_act: str = "gelu"
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    model_type: str = MODEL_TYPE

    def __post_init__(self):
        super().__post_init__()
        if self.rotary_ndims % 2:
            raise ConfigError(f"rotary_pct={self.rotary_pct} gives an odd rotary dimension {self.rotary_ndims}")

    @property
    def rotary_ndims(self) -> int:
        """How many dimensions of each head are rotated (head_dim * rotary_pct)."""
        return int(self.head_dim * self.rotary_pct)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "GPTNeoXConfig":
        """From a config.json dict (rotary as rope_parameters, rope_scaling or rotary_pct/rotary_emb_base)."""
        L.check_model_type(hf.get("model_type"), (MODEL_TYPE,), "GPT-NeoX")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"unsupported rope_parameters rope_type {rope_type!r} for GPT-NeoX; only 'default'")
        if hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
            raise ConfigError(f"head_dim={hf['head_dim']} != hidden_size / num_attention_heads is not supported")
        return L.config_from_hf(
            cls, hf, **L.token_ids(hf),
            rotary_pct=float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))),
            rotary_emb_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))))

    def to_hf(self) -> dict:
        """A config.json dict that `from_hf` reads back into this config (export)."""
        return L.config_to_hf(self, ("rotary_pct", "rotary_emb_base"), architectures=["GPTNeoXForCausalLM"],
                              rope_parameters={"rope_type": "default", "rope_theta": self.rotary_emb_base,
                                               "partial_rotary_factor": self.rotary_pct})


def _regroup_qkv(a, cfg):
    """convert_hf_to_gguf.py regroups query_key_value's rows from per head [H, 3, Dh] to [3, H, Dh]: undone."""
    H, Dh = cfg.num_attention_heads, cfg.head_dim
    return a.reshape(3, H, Dh, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)


def dims(c: GPTNeoXConfig) -> dict[str, int]:
    """The size of each logical axis of config ``c``'s parameters: {axis name: size}."""
    return {"vocab": c.vocab_size, "embed": c.hidden_size, "norm": c.hidden_size, "heads": c.num_attention_heads,
            "head_dim": c.head_dim, "qkv": 3, "mlp": c.intermediate_size}


def _biased(c: GPTNeoXConfig) -> bool:
    return c.attention_bias


# Hugging Face GPTNeoXForCausalLM ("gpt_neox." prefix or none) <-> GGUF gptneox
SPEC = WeightSpec("GPT-NeoX", dims, prefixes=(("gpt_neox.", ""), ("", "")), top=(
    embedding("embed", "embed_in.weight", "token_embd.weight"),
    norm("norm", "final_layer_norm.weight", "output_norm.weight"),
    bias("norm_b", "final_layer_norm.bias", "output_norm.bias"),
    embedding("lm_head", ("embed_out.weight", "lm_head.weight"), "output.weight", head=True,
              when=lambda c: not c.tie_word_embeddings),
), layers=(
    norm("attn_norm", "input_layernorm.weight", "attn_norm.weight"),
    bias("attn_norm_b", "input_layernorm.bias", "attn_norm.bias"),
    linear("w_qkv", "attention.query_key_value.weight", "attn_qkv.weight", ("embed", "heads", "qkv", "head_dim"),
           gguf_fix=_regroup_qkv),
    bias("b_qkv", "attention.query_key_value.bias", "attn_qkv.bias", ("heads", "qkv", "head_dim"), when=_biased,
         gguf_fix=_regroup_qkv),
    linear("wo", "attention.dense.weight", "attn_output.weight", ("heads", "head_dim", "embed"), n_in=2),
    bias("bo", "attention.dense.bias", "attn_output.bias", when=_biased),
    norm("mlp_norm", "post_attention_layernorm.weight", "ffn_norm.weight"),
    bias("mlp_norm_b", "post_attention_layernorm.bias", "ffn_norm.bias"),
    linear("w_up", "mlp.dense_h_to_4h.weight", "ffn_up.weight", ("embed", "mlp")),
    bias("b_up", "mlp.dense_h_to_4h.bias", "ffn_up.bias", ("mlp",)),
    linear("w_down", "mlp.dense_4h_to_h.weight", "ffn_down.weight", ("mlp", "embed")),
    bias("b_down", "mlp.dense_4h_to_h.bias", "ffn_down.bias"),
))


class GPTNeoX(CausalLM):
    """GPT-NeoX causal LM (see `CausalLM` for `__call__`, `hidden_states` and `decode`)."""

    spec = SPEC

    def context(self, positions):
        """The RoPE tables of ``positions`` over the first ``rotary_ndims`` of each head."""
        rd = self.config.rotary_ndims
        return L.rope_at(positions, 1.0 / self.config.rotary_emb_base ** (np.arange(0, rd, 2, dtype=np.float32)
                                                                           / max(rd, 1)))

    def normalize(self, x, w, b=None):
        """LayerNorm of x with scale ``w`` and bias ``b``."""
        return L.layer_norm(x, w, b, self.config.layer_norm_eps)

    def block(self, p, x, rope, xs, attend):
        """Attention (rotary on the first rotary_ndims of each head), then the parallel (or sequential) residual
        with the MLP."""
        cfg, rd = self.config, self.config.rotary_ndims

        def rotary(t):
            return t if rd == 0 else jnp.concatenate([apply_rope(t[..., :rd], *rope), t[..., rd:]], axis=-1)

        def mlp(h):
            h = L.mlp_activation(cfg.hidden_act, h @ p["w_up"] + p["b_up"])
            return h @ p["w_down"] + p["b_down"]

        h = self.normalize(x, p["attn_norm"], p["attn_norm_b"])
        qkv = plus(jnp.einsum("btd,dhck->bthck", h, p["w_qkv"]), p, "b_qkv")
        attn = attend(rotary(qkv[..., 0, :]), rotary(qkv[..., 1, :]), qkv[..., 2, :], cfg.head_dim ** -0.5)
        attn = plus(jnp.einsum("bthk,hkd->btd", attn, p["wo"]), p, "bo")
        if cfg.use_parallel_residual:
            return x + attn + mlp(self.normalize(x, p["mlp_norm"], p["mlp_norm_b"]))
        x = x + attn
        return x + mlp(self.normalize(x, p["mlp_norm"], p["mlp_norm_b"]))


# ----------------------------------------------------------------------------- checkpoints

params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf, SPEC.tensors_from_gguf, SPEC.gguf_to_hf()
from_params = GPTNeoX.from_params
GGUF_ARCH = "gptneox"


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> GPTNeoXConfig:
    """`GPTNeoXConfig` from `gptneox.*` metadata (vocabulary size from token_embd when `arrays` is given)."""
    get = GGUFMeta(meta, arrays)
    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = hidden // heads
    rotary_ndims = get("rope.dimension_count", head_dim)
    rotary_pct = rotary_ndims / head_dim
    if int(head_dim * rotary_pct) != rotary_ndims:  # keep int(head_dim * pct) == the stored count
        rotary_pct = float(np.nextafter(rotary_pct, 2.0))
    return GPTNeoXConfig(
        vocab_size=get.vocab_size(),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length", 4 * hidden),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        max_position_embeddings=get("context_length", 2048),
        rotary_pct=rotary_pct,
        rotary_emb_base=float(get("rope.freq_base", 10000.0)),
        layer_norm_eps=float(get("attention.layer_norm_epsilon", 1e-5)),
        use_parallel_residual=bool(get("use_parallel_residual", True)),
        tie_word_embeddings=arrays is not None and not get.has("output.weight"),
        **get.special_ids(),
    )

"""GPT-2 causal LM in Flax NNX: config, weight spec and block on the shared decoder (`causal_lm.CausalLM`).
Learned positions, a fused c_attn, LayerNorms with biases, the LM head tied to wte by default. GPT-2's Conv1D
weights are already `[in, out]` (llama.cpp transposes them to the Linear layout); they are only reshaped to put
heads on their own axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from mia_jax.models import layers as L
from mia_jax.models.causal_lm import CausalLM
from mia_jax.models.layers import ConfigError
from mia_jax.models.tensors import GGUFMeta
from mia_jax.models.weights import WeightSpec, bias, embedding, matrix, norm

MODEL_TYPE = "gpt2"


@dataclasses.dataclass(frozen=True)
class GPT2Config(L.MultiHeadConfig):
    """A GPT-2 config (the fields of its config.json this implementation reads)."""
    MODEL_TYPE, FAMILY, ACTIVATION = MODEL_TYPE, "GPT-2", "activation_function"
    DERIVED = {"intermediate_size": lambda c: 4 * c.hidden_size}  # GPT-2's n_inner=None

    max_position_embeddings: int = 1024
    intermediate_size: int | None = None  # n_inner; None = 4 * hidden_size
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True
    model_type: str = MODEL_TYPE

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "GPT2Config":
        """From a config.json dict (GPT-2 names n_embd/n_layer/n_head/n_positions or the generic ones).

        `reorder_and_upcast_attn` only changes the precision of transformers' eager attention; scores are
        always float32 here, so it is accepted. Cross-attention (`add_cross_attention`) is not supported.
        """
        L.check_model_type(hf.get("model_type"), (MODEL_TYPE,), "GPT-2")
        if hf.get("add_cross_attention"):
            raise ConfigError("add_cross_attention=True is not supported by the GPT-2 implementation")
        pick = lambda *keys, default=None: next((hf[k] for k in keys if hf.get(k) is not None), default)  # noqa: E731
        given = {name: value for gpt2, name in _NAMES.items() if (value := pick(gpt2, name)) is not None}
        return L.config_from_hf(cls, hf, **L.token_ids(hf), **given)

    def to_hf(self) -> dict:
        """A config.json dict that `from_hf` reads back into this config (export; GPT-2's own names)."""
        return L.config_to_hf(self, tuple(_NAMES.values()), architectures=["GPT2LMHeadModel"],
                              **{gpt2: getattr(self, name) for gpt2, name in _NAMES.items()})


# GPT-2's config.json names for the generic ones
_NAMES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
          "n_positions": "max_position_embeddings", "n_inner": "intermediate_size"}


def attention_scales(cfg: GPT2Config) -> np.ndarray:
    """Per-layer attention score scale [L] (1/sqrt(Dh) if scale_attn_weights, / (i+1) if by layer index)."""
    base = cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
    div = np.arange(1, cfg.num_hidden_layers + 1) if cfg.scale_attn_by_inverse_layer_idx else 1.0
    return (base / np.broadcast_to(div, (cfg.num_hidden_layers,))).astype(np.float32)


def _transposed(w, cfg):
    """convert_hf_to_gguf.py writes GPT-2's Conv1D weights transposed (Linear layout): undone."""
    return w.T


def dims(c: GPT2Config) -> dict[str, int]:
    """The size of each logical axis of config ``c``'s parameters: {axis name: size}."""
    return {"vocab": c.vocab_size, "embed": c.hidden_size, "norm": c.hidden_size, "heads": c.num_attention_heads,
            "head_dim": c.head_dim, "qkv": 3, "mlp": c.intermediate_size, "positions": c.max_position_embeddings}


# Hugging Face GPT2LMHeadModel ("transformer." prefix or none) <-> GGUF gpt2
SPEC = WeightSpec("GPT-2", dims, layer_hf="h.{i}.", prefixes=(("transformer.", ""), ("", "")), top=(
    embedding("embed", "wte.weight", "token_embd.weight"),
    embedding("pos_embed", "wpe.weight", "position_embd.weight", ("positions", "embed")),
    norm("norm", "ln_f.weight", "output_norm.weight"),
    bias("norm_b", "ln_f.bias", "output_norm.bias"),
    embedding("lm_head", "lm_head.weight", "output.weight", head=True, when=lambda c: not c.tie_word_embeddings),
), layers=(
    norm("attn_norm", "ln_1.weight", "attn_norm.weight"),
    bias("attn_norm_b", "ln_1.bias", "attn_norm.bias"),
    matrix("w_qkv", "attn.c_attn.weight", "attn_qkv.weight", ("embed", "qkv", "heads", "head_dim"),
           gguf_fix=_transposed),
    bias("b_qkv", "attn.c_attn.bias", "attn_qkv.bias", ("qkv", "heads", "head_dim")),
    matrix("wo", "attn.c_proj.weight", "attn_output.weight", ("heads", "head_dim", "embed"), n_in=2,
           gguf_fix=_transposed),
    bias("bo", "attn.c_proj.bias", "attn_output.bias"),
    norm("mlp_norm", "ln_2.weight", "ffn_norm.weight"),
    bias("mlp_norm_b", "ln_2.bias", "ffn_norm.bias"),
    matrix("w_up", "mlp.c_fc.weight", "ffn_up.weight", ("embed", "mlp"), gguf_fix=_transposed),
    bias("b_up", "mlp.c_fc.bias", "ffn_up.bias", ("mlp",)),
    matrix("w_down", "mlp.c_proj.weight", "ffn_down.weight", ("mlp", "embed"), gguf_fix=_transposed),
    bias("b_down", "mlp.c_proj.bias", "ffn_down.bias"),
))


class GPT2(CausalLM):
    """GPT-2 causal LM (see `CausalLM` for `__call__`, `hidden_states` and `decode`)."""

    spec = SPEC

    def layer_inputs(self):
        """The per-layer attention score scales [num_layers] (``attention_scales``)."""
        return jnp.asarray(attention_scales(self.config))

    def normalize(self, x, w, b=None):
        """LayerNorm of x with scale ``w`` and bias ``b``."""
        return L.layer_norm(x, w, b, self.config.layer_norm_epsilon)

    def block(self, p, x, ctx, scale, attend):
        """x + attn(ln_1(x)), then + mlp(ln_2(x))."""
        cfg = self.config
        h = self.normalize(x, p["attn_norm"], p["attn_norm_b"])
        qkv = jnp.einsum("btd,dchk->btchk", h, p["w_qkv"]) + p["b_qkv"]
        attn = attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale)
        x = x + jnp.einsum("bthk,hkd->btd", attn, p["wo"]) + p["bo"]
        h = self.normalize(x, p["mlp_norm"], p["mlp_norm_b"])
        h = L.mlp_activation(cfg.activation_function, h @ p["w_up"] + p["b_up"])
        return x + h @ p["w_down"] + p["b_down"]


# ----------------------------------------------------------------------------- checkpoints

params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf, SPEC.tensors_from_gguf, SPEC.gguf_to_hf()
from_params = GPT2.from_params
GGUF_ARCH = "gpt2"


def config_from_gguf(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> GPT2Config:
    """`GPT2Config` from `gpt2.*` metadata (vocabulary size from token_embd when `arrays` is given).

    llama.cpp writes output.weight as a copy of token_embd for GPT-2, so the config is untied then."""
    get = GGUFMeta(meta, arrays)
    hidden = get("embedding_length")
    return GPT2Config(
        vocab_size=get.vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=get("block_count"),
        num_attention_heads=get("attention.head_count"),
        max_position_embeddings=get("context_length", 1024),
        intermediate_size=get("feed_forward_length", 4 * hidden),
        layer_norm_epsilon=float(get("attention.layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=not get.has("output.weight"),
        **get.special_ids(),
    )

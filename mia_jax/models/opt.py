"""OPT causal LM in Flax NNX: config, weight spec and block on the shared decoder (`causal_lm.CausalLM`).
Learned positions with offset 2, pre- or post-LayerNorm layers, optional project_in/project_out when
word_embed_proj_dim != hidden_size (OPT-350m), optional biases and LayerNorm affines, tied lm_head by default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from mia_jax.models import layers as L
from mia_jax.models.causal_lm import CausalLM, plus
from mia_jax.models.weights import WeightSpec, bias, embedding, linear, norm

MODEL_TYPE = "opt"
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row = position + 2
LAYER_NORM_EPS = 1e-5  # transformers' nn.LayerNorm default; OPT has no config option for it


@dataclasses.dataclass(frozen=True)
class OPTConfig(L.MultiHeadConfig):
    """An OPT config (the fields of its config.json this implementation reads)."""
    MODEL_TYPE, FAMILY, ACTIVATION = MODEL_TYPE, "OPT", "activation_function"
    DERIVED = {"word_embed_proj_dim": lambda c: c.hidden_size}  # no project_in / project_out

    ffn_dim: int
    max_position_embeddings: int = 2048
    word_embed_proj_dim: int | None = None  # None = hidden_size (no project_in / project_out)
    do_layer_norm_before: bool = True
    remove_final_layer_norm: bool = False  # config.json `_remove_final_layer_norm`
    activation_function: str = "relu"
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True
    tie_word_embeddings: bool = True
    model_type: str = MODEL_TYPE

    @property
    def projected(self) -> bool:
        """Whether the embeddings are projected in and out (word_embed_proj_dim != hidden_size)."""
        return self.word_embed_proj_dim != self.hidden_size

    @property
    def final_layer_norm(self) -> bool:
        """Whether the decoder ends with a LayerNorm (pre-LN and not removed)."""
        return self.do_layer_norm_before and not self.remove_final_layer_norm

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "OPTConfig":
        """From a config.json dict."""
        L.check_model_type(hf.get("model_type"), (MODEL_TYPE,), "OPT")
        return L.config_from_hf(cls, hf, **L.token_ids(hf),
                                remove_final_layer_norm=bool(hf.get("_remove_final_layer_norm", False)))

    def to_hf(self) -> dict:
        """A config.json dict that `from_hf` reads back into this config (export)."""
        return L.config_to_hf(self, ("remove_final_layer_norm",), architectures=["OPTForCausalLM"],
                              _remove_final_layer_norm=self.remove_final_layer_norm)


def dims(c: OPTConfig) -> dict[str, int]:
    """The size of each logical axis of config ``c``'s parameters: {axis name: size}."""
    return {"vocab": c.vocab_size, "embed": c.hidden_size, "norm": c.hidden_size, "heads": c.num_attention_heads,
            "head_dim": c.head_dim, "mlp": c.ffn_dim, "embed_proj": c.word_embed_proj_dim,
            "positions": c.max_position_embeddings + POSITION_OFFSET}


def _biased(c: OPTConfig) -> bool:
    return c.enable_bias


def _affine(c: OPTConfig) -> bool:
    return c.layer_norm_elementwise_affine


def _projected(c: OPTConfig) -> bool:
    return c.projected


def _final_norm(c: OPTConfig) -> bool:
    return c.final_layer_norm and c.layer_norm_elementwise_affine


def _qkv(n: str, hf: str):
    return (linear(f"w{n}", f"self_attn.{hf}_proj.weight", None, ("embed", "heads", "head_dim")),
            bias(f"b{n}", f"self_attn.{hf}_proj.bias", None, ("heads", "head_dim"), when=_biased))


# Hugging Face OPTForCausalLM ("model.decoder.", "decoder." or no prefix); llama.cpp has no OPT architecture
SPEC = WeightSpec("OPT", dims, prefixes=(("model.decoder.", ""), ("decoder.", ""), ("", "")), top=(
    embedding("embed", "embed_tokens.weight", None, ("vocab", "embed_proj")),
    embedding("pos_embed", "embed_positions.weight", None, ("positions", "embed")),
    linear("project_in", "project_in.weight", None, ("embed_proj", "embed"), when=_projected),
    norm("norm", "final_layer_norm.weight", None, when=_final_norm),
    bias("norm_b", "final_layer_norm.bias", None, when=_final_norm),
    linear("project_out", "project_out.weight", None, ("embed", "embed_proj"), when=_projected),
    embedding("lm_head", "lm_head.weight", None, ("vocab", "embed_proj"), head=True,
              when=lambda c: not c.tie_word_embeddings),
), layers=(
    norm("attn_norm", "self_attn_layer_norm.weight", None, when=_affine),
    bias("attn_norm_b", "self_attn_layer_norm.bias", None, when=_affine),
    *_qkv("q", "q"), *_qkv("k", "k"), *_qkv("v", "v"),
    linear("wo", "self_attn.out_proj.weight", None, ("heads", "head_dim", "embed"), n_in=2),
    bias("bo", "self_attn.out_proj.bias", None, when=_biased),
    norm("mlp_norm", "final_layer_norm.weight", None, when=_affine),
    bias("mlp_norm_b", "final_layer_norm.bias", None, when=_affine),
    linear("w_up", "fc1.weight", None, ("embed", "mlp")),
    bias("b_up", "fc1.bias", None, ("mlp",), when=_biased),
    linear("w_down", "fc2.weight", None, ("mlp", "embed")),
    bias("b_down", "fc2.bias", None, when=_biased),
))


class OPT(CausalLM):
    """OPT causal LM (see `CausalLM`). Positions are arange(T) + 2 in the full forward, as transformers computes
    them for an all-ones attention mask; `decode` counts them from each row's first real token."""

    spec = SPEC
    position_offset = POSITION_OFFSET

    def normalize(self, x, w, b=None):
        """LayerNorm of x with scale ``w`` and bias ``b`` (None: no affine part)."""
        return L.layer_norm(x, w, b, LAYER_NORM_EPS)

    def block(self, p, x, ctx, xs, attend):
        """Pre-LN (x + attn(ln(x)), x + mlp(ln(x))) or post-LN (ln(x + attn(x)), ln(x + mlp(x))) layer; q is scaled
        before the product, as transformers does."""
        pre = self.config.do_layer_norm_before
        ln1 = lambda t: self.normalize(t, p.get("attn_norm"), p.get("attn_norm_b"))  # noqa: E731
        ln2 = lambda t: self.normalize(t, p.get("mlp_norm"), p.get("mlp_norm_b"))  # noqa: E731
        h = ln1(x) if pre else x
        proj = lambda n: plus(jnp.einsum("btd,dhk->bthk", h, p[f"w{n}"]), p, f"b{n}")  # noqa: E731
        attn = attend(proj("q") * jnp.asarray(self.config.head_dim ** -0.5, h.dtype), proj("k"), proj("v"), 1.0)
        x = plus(x + jnp.einsum("bthk,hkd->btd", attn, p["wo"]), p, "bo")
        x = x if pre else ln1(x)
        h = ln2(x) if pre else x
        h = L.mlp_activation(self.config.activation_function, plus(h @ p["w_up"], p, "b_up"))
        x = plus(x + h @ p["w_down"], p, "b_down")
        return x if pre else ln2(x)

    def final(self, x):
        """The last hidden states x [B, T, D] through the final norm (also without affine parameters) and project_out.
        """
        if self.config.final_layer_norm and self.norm is None:  # layer_norm_elementwise_affine=False
            x = self.normalize(x, None, None)
        return super().final(x)


params_from_hf, from_params = SPEC.from_hf, OPT.from_params

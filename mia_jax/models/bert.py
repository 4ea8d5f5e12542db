"""BERT and RoBERTa masked LMs in Flax NNX (bidirectional attention with a padding mask, post-LN layers).

Used to propose word replacements for the ``neighbor`` method (``mia_jax.methods.neighbors.MLMNeighbors``); not a
scoring model. Layers are stacked on a leading axis and applied with `jax.lax.scan`. Hugging Face names:
BertForMaskedLM (``bert.`` encoder, ``cls.predictions`` head) and RobertaForMaskedLM (``roberta.`` encoder,
``lm_head``; positions start at ``pad_token_id + 1`` and padding tokens keep position ``pad_token_id``).
The decoder is tied to the word embeddings unless ``tie_word_embeddings`` is false.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.models import hf, layers as L
from mia_jax.models.layers import ConfigError
from mia_jax.models.weights import WeightSpec, bias, embedding, init_params, linear, norm

MODEL_TYPES = ("bert", "roberta")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT / RoBERTa masked-LM config (the fields of its config.json this implementation reads)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    tie_word_embeddings: bool = True
    model_type: str = "bert"
    pad_token_id: int | None = 0

    def __post_init__(self):
        L.check_model_type(self.model_type, MODEL_TYPES, "a masked LM")
        L.check_heads(self.hidden_size, self.num_attention_heads)
        L.check_activation("hidden_act", self.hidden_act)
        if self.model_type == "roberta" and self.pad_token_id is None:
            raise ConfigError("RoBERTa needs pad_token_id (its positions start at pad_token_id + 1)")
        if self.max_length < 1:
            raise ConfigError(f"max_position_embeddings={self.max_position_embeddings} leaves no position for a "
                              f"token (RoBERTa's positions start at pad_token_id + 1 = {self.position_offset})")

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head (hidden_size / num_attention_heads)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """Position id of the first token: 0 for BERT, pad_token_id + 1 for RoBERTa."""
        return self.pad_token_id + 1 if self.model_type == "roberta" else 0

    @property
    def max_length(self) -> int:
        """The longest input (special tokens included) the position table covers."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "BertConfig":
        """From a BertForMaskedLM / RobertaForMaskedLM config.json dict; options this implementation does not
        have (relative position embeddings, decoder/cross-attention use) are refused by name."""
        mt = L.check_model_type(hf.get("model_type"), MODEL_TYPES, "a masked LM")
        pos = hf.get("position_embedding_type", "absolute")
        if pos not in (None, "absolute"):
            raise ConfigError(f"position_embedding_type={pos!r} is not supported (only 'absolute')")
        for option in ("is_decoder", "add_cross_attention"):
            if hf.get(option):
                raise ConfigError(f"{option}=True is not supported: a masked LM is a bidirectional encoder")
        act = hf.get("hidden_act", "gelu")
        if not isinstance(act, str):
            raise ConfigError(f"unsupported hidden_act {act!r}")
        eps, pad = (1e-12, 0) if mt == "bert" else (1e-5, 1)
        return L.config_from_hf(cls, hf, layer_norm_eps=float(hf.get("layer_norm_eps", eps)),
                                pad_token_id=hf.get("pad_token_id", pad))


def bidirectional_attention(q, k, v, scale, key_mask):
    """q, k, v [B, T, H, Dh], key_mask bool [B, T] -> [B, T, H, Dh]; scores and softmax in float32."""
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v)


def dims(c: BertConfig) -> dict[str, int]:
    """The size of each logical axis of config ``c``'s parameters: {axis name: size}."""
    return {"vocab": c.vocab_size, "embed": c.hidden_size, "norm": c.hidden_size, "heads": c.num_attention_heads,
            "head_dim": c.head_dim, "mlp": c.intermediate_size, "positions": c.max_position_embeddings,
            "types": c.type_vocab_size}


def _spec(model_type: str) -> WeightSpec:
    """BertForMaskedLM (``cls.predictions`` head) or RobertaForMaskedLM (``lm_head``); no GGUF names."""
    head = {"bert": "transform.", "roberta": ""}[model_type]
    head_norm = {"bert": "transform.LayerNorm.", "roberta": "layer_norm."}[model_type]
    body, head_prefix = ("bert.", "cls.predictions.") if model_type == "bert" else ("roberta.", "lm_head.")
    top = (
        embedding("embed", "embeddings.word_embeddings.weight", None),
        embedding("pos_embed", "embeddings.position_embeddings.weight", None, ("positions", "embed")),
        embedding("type_embed", "embeddings.token_type_embeddings.weight", None, ("types", "embed")),
        norm("embed_norm", "embeddings.LayerNorm.weight", None),
        bias("embed_norm_b", "embeddings.LayerNorm.bias", None),
        linear("head_dense", head + "dense.weight", None, ("embed", "norm"), head=True),
        bias("head_dense_b", head + "dense.bias", None, head=True),
        norm("head_norm", head_norm + "weight", None, head=True),
        bias("head_norm_b", head_norm + "bias", None, head=True),
        bias("head_bias", ("bias", "decoder.bias"), None, ("vocab",), head=True),
        embedding("lm_head", "decoder.weight", None, head=True, when=lambda c: not c.tie_word_embeddings),
    )
    qkv = [w for n, hf in (("q", "query"), ("k", "key"), ("v", "value")) for w in (
        linear(f"w{n}", f"attention.self.{hf}.weight", None, ("embed", "heads", "head_dim")),
        bias(f"b{n}", f"attention.self.{hf}.bias", None, ("heads", "head_dim")))]
    return WeightSpec("BERT" if model_type == "bert" else "RoBERTa", dims, top=top, layer_hf="encoder.layer.{i}.",
                      prefixes=((body, head_prefix), ("", head_prefix)),
                      layers=(*qkv,
                              linear("wo", "attention.output.dense.weight", None, ("heads", "head_dim", "embed"),
                                     n_in=2),
                              bias("bo", "attention.output.dense.bias", None),
                              norm("attn_norm", "attention.output.LayerNorm.weight", None),
                              bias("attn_norm_b", "attention.output.LayerNorm.bias", None),
                              linear("w_up", "intermediate.dense.weight", None, ("embed", "mlp")),
                              bias("b_up", "intermediate.dense.bias", None, ("mlp",)),
                              linear("w_down", "output.dense.weight", None, ("mlp", "embed")),
                              bias("b_down", "output.dense.bias", None),
                              norm("mlp_norm", "output.LayerNorm.weight", None),
                              bias("mlp_norm_b", "output.LayerNorm.bias", None)))


SPECS = {t: _spec(t) for t in MODEL_TYPES}
SPEC = SPECS["bert"]  # the internal names and logical axes (RoBERTa's are the same)


def _layer(cfg: BertConfig, p, x, key_mask):
    """One post-LN encoder layer: x = LN(x + attn(x)); x = LN(x + mlp(x))."""
    eps = cfg.layer_norm_eps
    q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[f"w{n}"]) + p[f"b{n}"] for n in "qkv")
    attn = bidirectional_attention(q, k, v, cfg.head_dim ** -0.5, key_mask)
    x = L.layer_norm(x + jnp.einsum("bthk,hkd->btd", attn, p["wo"]) + p["bo"], p["attn_norm"], p["attn_norm_b"], eps)
    h = L.mlp_activation(cfg.hidden_act, x @ p["w_up"] + p["b_up"])
    return L.layer_norm(x + h @ p["w_down"] + p["b_down"], p["mlp_norm"], p["mlp_norm_b"], eps)


class BertMLM(nnx.Module):
    """BERT / RoBERTa encoder + masked-LM head. ``attention_mask`` (1 = real token) masks padded keys."""

    def __init__(self, config: BertConfig, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        self.config, self.dtype = config, dtype
        init_params(self, SPECS[config.model_type], config, L.check_dtype(dtype),
                    rngs if rngs is not None else nnx.Rngs(0))

    def position_ids(self, input_ids):
        """Position ids [B, T] of ``input_ids`` [B, T]: 0, 1, ... for BERT; RoBERTa's count real tokens from
        pad_token_id + 1 and keep pad_token_id on padding."""
        cfg = self.config
        if cfg.model_type == "roberta":  # as transformers: from the ids, padding tokens keep pad_token_id
            real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
            return jnp.cumsum(real, axis=1) * real + cfg.pad_token_id
        return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)

    def hidden_states(self, input_ids, attention_mask=None):
        """int [B, T] (+ attention_mask [B, T]) -> encoder output [B, T, D] (parameter dtype)."""
        cfg = self.config
        L.check_length(input_ids.shape[1], cfg.max_length, "BERT")
        key_mask = (jnp.ones(input_ids.shape, bool) if attention_mask is None
                    else jnp.asarray(attention_mask).astype(bool))
        x = (jnp.take(self.embed[...], input_ids, axis=0) + self.type_embed[...][0]
             + jnp.take(self.pos_embed[...], self.position_ids(input_ids), axis=0))
        x = L.layer_norm(x, self.embed_norm[...], self.embed_norm_b[...], cfg.layer_norm_eps)
        return self.layers.scan(lambda p, h, _: _layer(cfg, p, h, key_mask), x)

    def unembedding(self):
        """[V, D]: the word embeddings when tied, else the decoder."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def head(self, hidden):
        """Encoder output [..., D] -> float32 MLM logits [..., V] (dense, activation, LayerNorm, decoder + bias).

        BERT's transform uses ``hidden_act``; RoBERTa's lm_head always uses exact gelu."""
        cfg = self.config
        h = hidden @ self.head_dense[...] + self.head_dense_b[...]
        h = L.mlp_activation(cfg.hidden_act if cfg.model_type == "bert" else "gelu", h)
        h = L.layer_norm(h, self.head_norm[...], self.head_norm_b[...], cfg.layer_norm_eps)
        logits = jnp.einsum("...d,vd->...v", h, self.unembedding(), preferred_element_type=jnp.float32)
        return logits + self.head_bias[...].astype(jnp.float32)

    def __call__(self, input_ids, attention_mask=None):
        """int [B, T] -> float32 logits [B, T, V]."""
        return self.head(self.hidden_states(input_ids, attention_mask))


def _rename_legacy(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Old TF-converted BERT checkpoints name LayerNorm parameters gamma / beta."""
    out = {}
    for k, v in tensors.items():
        if ".LayerNorm." in k or ".layer_norm." in k:
            k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[k] = v
    return out


def params_from_hf(cfg: BertConfig, tensors: Mapping[str, np.ndarray]) -> dict:
    """A BertForMaskedLM / RobertaForMaskedLM state dict -> nested dict matching `BertMLM` (from its weight
    spec). A checkpoint without the masked-LM head (e.g. a sentence encoder) is refused."""
    spec = SPECS[cfg.model_type]
    head = spec.prefixes[0][1]
    if not any(k.startswith(head) for k in tensors):
        raise UserError(f"{spec.family} checkpoint has no masked-LM head ({head}*): it is not a *ForMaskedLM model")
    return spec.from_hf(cfg, _rename_legacy(tensors))


def from_params(cfg: BertConfig, params: dict, dtype: str = "float32", place=None) -> BertMLM:
    """A ``BertMLM`` of config ``cfg`` holding ``params`` (nested dict) in ``dtype``; ``place`` as in
    ``layers.build_module``."""
    return L.build_module(BertMLM, cfg, params, dtype, place)


_MASK_NAMES = ("[MASK]", "<mask>")


def _mask_token_id(folder: Path, tokenizer: tokenizers.Tokenizer) -> int:
    names = list(_MASK_NAMES)
    tc = folder / "tokenizer_config.json"
    if tc.exists():
        value = hf.read_json(tc).get("mask_token")
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            names.insert(0, value)
    for name in names:
        tid = tokenizer.token_to_id(name)
        if tid is not None:
            return tid
    raise UserError(f"{folder}: the tokenizer has no mask token (looked for {names})")


def load_mlm(path: str, dtype: str = "float32") -> tuple[BertMLM, tokenizers.Tokenizer, int, dict]:
    """A BERT / RoBERTa masked LM from a local Hugging Face folder (config.json, *.safetensors, tokenizer.json).

    Returns (model, tokenizer, mask_token_id, info) where info records name, source, model_type, max_length
    and the sha256 of every file read."""
    folder = Path(path).expanduser()
    config_path = folder / "config.json"
    if not folder.is_dir() or not config_path.exists():
        raise UserError(f"{folder}: not a Hugging Face masked-LM folder (config.json, model.safetensors, "
                        "tokenizer.json)")
    cfg = hf.parse_config(BertConfig, hf.read_json(config_path), config_path)
    weights = hf.weight_files(folder)
    tok_file = folder / "tokenizer.json"
    if not tok_file.exists():
        raise UserError(f"{folder}: no tokenizer.json")
    tokenizer = hf.read_tokenizer(tok_file)
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise UserError(f"{folder}: tokenizer has {tokenizer.get_vocab_size()} tokens but the model only "
                        f"{cfg.vocab_size}")
    model = from_params(cfg, params_from_hf(cfg, hf.read_safetensors(weights)), dtype)
    files = [config_path, *weights, tok_file] + [f for f in [folder / "tokenizer_config.json"] if f.exists()]
    info = {"name": folder.name, "source": str(folder), "model_type": cfg.model_type, "dtype": dtype,
            "max_length": cfg.max_length, "files": {str(f): sha256(f) for f in files}}
    return model, tokenizer, _mask_token_id(folder, tokenizer), info

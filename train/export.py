"""Save a Llama-family model in the Hugging Face layout (config.json + model.safetensors + tokenizer.json),
so that ``mia_jax.models.load(folder)`` and ``mia-jax eval --model folder`` read it back.

This is the inverse of ``mia_jax.models.llama.params_from_hf``, written as an explicit name-mapping table
(internal name -> Hugging Face name, and the reshape from the internal ``[in, out]`` layout with heads on
their own axis back to PyTorch's ``[out, in]``). Weights are written in float32 (the master weights).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.models.llama import LlamaConfig

# internal layer parameter -> (HF name inside model.layers.{i}., conversion to HF's [out, in] layout)
LAYER_TO_HF = {
    "attn_norm": ("input_layernorm.weight", lambda w, c: w),
    "wq": ("self_attn.q_proj.weight", lambda w, c: w.reshape(c.hidden_size, -1).T),
    "wk": ("self_attn.k_proj.weight", lambda w, c: w.reshape(c.hidden_size, -1).T),
    "wv": ("self_attn.v_proj.weight", lambda w, c: w.reshape(c.hidden_size, -1).T),
    "wo": ("self_attn.o_proj.weight", lambda w, c: w.reshape(-1, c.hidden_size).T),
    "bq": ("self_attn.q_proj.bias", lambda b, c: b.reshape(-1)),
    "bk": ("self_attn.k_proj.bias", lambda b, c: b.reshape(-1)),
    "bv": ("self_attn.v_proj.bias", lambda b, c: b.reshape(-1)),
    "bo": ("self_attn.o_proj.bias", lambda b, c: b),
    "mlp_norm": ("post_attention_layernorm.weight", lambda w, c: w),
    "w_gate": ("mlp.gate_proj.weight", lambda w, c: w.T),
    "w_up": ("mlp.up_proj.weight", lambda w, c: w.T),
    "w_down": ("mlp.down_proj.weight", lambda w, c: w.T),
}
TOP_TO_HF = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def tensors_to_hf(cfg: LlamaConfig, params: dict) -> dict[str, np.ndarray]:
    """Nested params of a ``Llama`` (``nnx.to_pure_dict`` of its state) -> HF-named float32 numpy tensors."""
    out = {}
    for key, hf_name in TOP_TO_HF.items():
        if key in params and params[key] is not None:
            out[hf_name] = np.asarray(params[key], np.float32)
    for key, stacked in params["layers"].items():
        if key not in LAYER_TO_HF:
            raise UserError(f"export: no Hugging Face name for layer parameter {key!r}")
        hf_name, conv = LAYER_TO_HF[key]
        stacked = np.asarray(stacked, np.float32)
        for i in range(cfg.num_hidden_layers):
            out[f"model.layers.{i}.{hf_name}"] = np.ascontiguousarray(conv(stacked[i], cfg))
    return out


def config_to_hf(cfg: LlamaConfig) -> dict:
    """A config.json dict that ``LlamaConfig.from_hf`` reads back into ``cfg``."""
    if cfg.model_type != "llama":
        raise UserError(f"export supports model_type 'llama' (got {cfg.model_type!r}); its config.json fields differ")
    if cfg.rope_freq_factors is not None:
        raise UserError("export: this model has GGUF rope_freqs factors, which a Hugging Face config.json cannot express")
    hf = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
    }
    if cfg.attention_bias != cfg.attention_out_bias:
        raise UserError("export: q/k/v biases without an output bias (Qwen2 style) are not a 'llama' config")
    return hf


def save_hf(folder: str | os.PathLike, model: nnx.Module, tokenizer, params: dict | None = None) -> Path:
    """Write ``folder``/{config.json, model.safetensors, tokenizer.json} atomically (a temporary folder renamed
    into place). ``params`` (a nested dict) replaces the model's own parameters when given."""
    from safetensors.numpy import save_file

    cfg = model.config
    hf_config = config_to_hf(cfg)
    if params is None:
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), params)
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors_to_hf(cfg, params), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tokenizer.save(str(tmp / "tokenizer.json"))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder

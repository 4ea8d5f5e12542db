"""Flax NNX causal LMs and checkpoint loading (HF folders, GGUF files, packaged offline models).

Layout:
    layers.py      network ops (norms, activations, RoPE, attention, KV cache layout), config helpers, build_module
    attention.py   the attention implementations behind layers' attention functions
    causal_lm.py   `CausalLM`: the decoder every family shares (embedding, layer scan, final norm, unembedding,
                   __call__, hidden_states, init_cache, decode, decode_hidden)
    weights.py     `WeightSpec`: one table per family (internal / HF / GGUF names, layouts, logical axes) from
                   which loading, GGUF renaming, HF export and the partition rules are generated
    tensors.py     lazy checkpoint tensors, GGUF metadata lookups
    hf.py, gguf_io.py, checkpoint.py   reading HF folders and GGUF files; `load`, the `ARCHITECTURES` table
    llama.py (Llama, Mistral, Qwen2), gemma3.py, gpt_neox.py, gpt2.py, opt.py, phi3.py   the causal LM families
    bert.py        BERT / RoBERTa masked LMs (for neighbour generation; not a CausalLM, same weight spec and init)

Adding a family (Phi-3 was added this way: phi3.py, one line in checkpoint.py, tests/test_phi3.py):

1. `mia_jax/models/<family>.py`, with
   a. its config: a frozen dataclass with Hugging Face field names subclassing `layers.BaseConfig` (or
      `layers.MultiHeadConfig`, or a related family's config: `Phi3Config(LlamaConfig)`), with `from_hf(dict)`
      (mostly `layers.config_from_hf(cls, hf, **what_differs)`) and `to_hf()` (`layers.config_to_hf`, for export);
   b. `SPEC = weights.WeightSpec(...)`: one row per parameter (`linear`, `matrix`, `embedding`, `norm`, `bias`):
      internal name (the shared scheme: embed, norm, lm_head; attn_norm, wq/wk/wv or w_qkv, wo, mlp_norm,
      w_gate/w_up/w_down, b*), HF name, GGUF name, logical axes, `when(cfg)` for optional ones, `gguf_fix` where
      llama.cpp changed the array; parts of a fused HF tensor are consecutive rows with the same HF name. Rows
      of a related family can be reused (`llama.TOP`, `llama.SPEC.layers`);
   c. its model: a `causal_lm.CausalLM` subclass (or a related family's model: `Phi3(Llama)`) with `spec = SPEC`,
      `block(p, x, ctx, xs, attend)`, `normalize(x, w, b)`, and where needed `context(positions)` (RoPE tables),
      `layer_inputs()` (per-layer values), `embed_tokens` (e.g. Gemma's scaled embedding);
   d. the module API `checkpoint` uses: `params_from_hf, tensors_from_gguf, GGUF_TO_HF = SPEC.from_hf,
      SPEC.tensors_from_gguf, SPEC.gguf_to_hf()`, `from_params = Model.from_params`, and for GGUF files
      `config_from_gguf(meta, arrays)` (with `tensors.GGUFMeta`).
2. `mia_jax/models/checkpoint.py`: an `ARCHITECTURES` entry for each config.json `model_type` / GGUF
   `general.architecture` spelling.
3. `tests/test_<family>.py`: logit parity against transformers in float32 and bfloat16, decode against the full
   forward, a GGUF round trip if llama.cpp has the architecture.

Nothing else changes: HF and GGUF loading (streamed, converted per layer), export (`train/export.py`), the
partition rules (`sharding.PARTITION_RULES`, from the logical axes via `sharding.LOGICAL_AXIS_RULES`; a new logical
axis needs a row there only if it is to be sharded), scoring and generation all come from the spec and the skeleton.
"""

from mia_jax.models.checkpoint import ARCHITECTURES, PACKAGED_MODELS, LoadedModel, architecture, load, resolve_model
from mia_jax.models.gemma3 import Gemma3, Gemma3Config
from mia_jax.models.llama import Llama, LlamaConfig

__all__ = ["ARCHITECTURES", "PACKAGED_MODELS", "Gemma3", "Gemma3Config", "Llama", "LlamaConfig", "LoadedModel",
           "architecture", "load", "resolve_model"]

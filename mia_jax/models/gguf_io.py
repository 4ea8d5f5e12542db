"""GGUF files (llama.cpp) -> Hugging Face-named float32 tensors, a `LlamaConfig` and a `tokenizers.Tokenizer`."""

from __future__ import annotations

import re

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mia_jax.errors import UserError
from mia_jax.models.llama import LlamaConfig

SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor name -> Hugging Face name ("{i}" is the layer index).
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope scaling, stored as per-frequency divisors

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(add_prefix_space: bool = False):
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)


def _split_then_bytes(regex: str):
    return lambda _: pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)]
    )


# tokenizer.ggml.pre -> pre-tokenizer builder (argument: add_prefix_space); anything else gets plain ByteLevel.
PRE_TOKENIZERS = {
    "smollm": lambda p: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(p)]),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-v3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
}


def read_metadata(reader) -> dict:
    """All key/value fields of a `gguf.GGUFReader` as Python values."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _gguf_name_key(name: str) -> tuple[str, str]:
    """'blk.3.attn_q.weight' -> ('blk.{i}.attn_q.weight', '3')."""
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    return (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (name, "")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `permute` of q/k projection rows (llama.cpp's interleaved RoPE)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_architecture(meta: dict, path: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def config_from_gguf(meta: dict, arrays: dict[str, np.ndarray], rope_freqs: np.ndarray | None) -> LlamaConfig:
    """`LlamaConfig` from `{arch}.*` and `tokenizer.ggml.*` metadata (vocab size from the embedding)."""
    arch = meta["general.architecture"]
    get = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    scaling_type = get("rope.scaling.type", "none")
    rope_scaling = None
    if scaling_type != "none":
        rope_scaling = {"rope_type": scaling_type, "factor": get("rope.scaling.factor")}
    return LlamaConfig(
        vocab_size=arrays["token_embd.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        head_dim=get("attention.key_length") or get("rope.dimension_count") or hidden // heads,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        rope_freq_factors=None if rope_freqs is None else tuple(float(x) for x in rope_freqs),
        max_position_embeddings=get("context_length", 2048),
        tie_word_embeddings="output.weight" not in arrays,
        sliding_window=get("attention.sliding_window"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def read_gguf(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray], dict]:
    """(config, HF-named float32 tensors, metadata) of a llama-architecture GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    meta = read_metadata(reader)
    check_architecture(meta, path)
    arrays = {}
    for t in reader.tensors:
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        arrays[t.name] = a.reshape(tuple(int(n) for n in reversed(t.shape)))  # GGUF lists dims fastest-first
    rope_freqs = arrays.pop(ROPE_FREQS, None)
    if "token_embd.weight" not in arrays:
        raise UserError(f"{path}: no token_embd.weight tensor")
    cfg = config_from_gguf(meta, arrays, rope_freqs)
    tensors = {}
    for name, a in arrays.items():
        key, layer = _gguf_name_key(name)
        if key not in GGUF_TO_HF:
            raise UserError(f"{path}: unexpected tensor {name!r} for a llama GGUF")
        if key == "blk.{i}.attn_q.weight":
            a = unpermute_qk(a, cfg.num_attention_heads)
        elif key == "blk.{i}.attn_k.weight":
            a = unpermute_qk(a, cfg.num_key_value_heads)
        tensors[GGUF_TO_HF[key].format(i=layer)] = a
    return cfg, tensors, meta


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_from_gguf(meta: dict, path: str) -> Tokenizer:
    """Byte-level BPE tokenizer from `tokenizer.ggml.*` metadata (`tokenizer.ggml.model == "gpt2"`)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UserError(
            f"{path}: building a tokenizer from GGUF tokenizer model {kind!r} is not implemented (only 'gpt2' "
            "byte-level BPE); pass tokenizer_path= a tokenizer.json for this model"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    in_alphabet = [set(t) <= alphabet for t in tokens]
    vocab = {
        t if ok else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, (t, ok) in enumerate(zip(tokens, in_alphabet))
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    tok.pre_tokenizer = PRE_TOKENIZERS.get(meta.get("tokenizer.ggml.pre"), _byte_level)(add_prefix)
    tok.decoder = decoders.ByteLevel()
    # 3 = control (special, e.g. <|endoftext|>); 4 = user-defined (matched whole, not special)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty, ok in zip(tokens, types, in_alphabet) if ty == 3 and ok]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    tok.post_processor = _template(meta, tokens)
    return tok


def _template(meta: dict, tokens: list[str]):
    """BOS/EOS post-processor per tokenizer.ggml.add_bos_token / add_eos_token (None when neither)."""
    specials, single = [], "$A:0"
    for key, flag, fmt in (("bos", "add_bos_token", "{t}:0 {s}"), ("eos", "add_eos_token", "{s} {t}:0")):
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        if meta.get(f"tokenizer.ggml.{flag}") and tid is not None:
            single = fmt.format(t=tokens[tid], s=single)
            specials.append((tokens[tid], tid))
    if not specials:
        return None
    pair = single + " " + single.replace("$A:0", "$B:1").replace(":0", ":1")
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

"""The ``tiny`` base model: a randomly initialised Llama with a small byte-level BPE tokenizer, written as a
Hugging Face folder (config.json + model.safetensors + tokenizer.json) and loaded like any other model.

Same recipe as the tests' ``write_tiny_llama`` (tests/conftest.py), but with the tokenizer trained on the
bundled corpus text and a trainable initialisation (``Llama``'s own: N(0, 1/fan_in) projections, 0.02
embeddings), because this model is continued-pretrained rather than only scored.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mia_jax.data import corpora
from mia_jax.models.llama import Llama, LlamaConfig
from train.config import TinyModelConfig
from train.sources import BUNDLED, DOWNSTREAM_FILES, TEMPLATES, read_jsonl, read_rows
from train.export import save_hf

EOS = "<|endoftext|>"


def training_texts(limit_chars: int = 600_000) -> list[str]:
    """The bundled text (Pile sample + formatted downstream examples + news), in file order."""
    texts = [r["text"] for r in read_jsonl(corpora.PILE_SAMPLE, "tiny tokenizer")]
    for name, file in DOWNSTREAM_FILES.items():
        texts += [TEMPLATES[name](row)[2] for row in read_rows(name, BUNDLED / "downstream" / file)]
    texts += [r["text"] for r in read_jsonl(BUNDLED / "news2023_sample.jsonl", "tiny tokenizer")]
    out, total = [], 0
    for t in texts:
        if total >= limit_chars:
            break
        out.append(t)
        total += len(t)
    return out


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer of ``vocab_size`` ids trained on ``training_texts()`` (EOS its one special token)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_texts(), trainer)
    return tok


def write_tiny_model(folder: str | Path, cfg: TinyModelConfig) -> Path:
    """Create the tiny model folder (deterministic for a given ``cfg``)."""
    tok = tiny_tokenizer(cfg.vocab_size)
    eos = tok.token_to_id(EOS)
    llama_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = Llama(llama_cfg, rngs=nnx.Rngs(cfg.seed))
    folder = save_hf(folder, model, tok)
    (folder / "tiny_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return folder

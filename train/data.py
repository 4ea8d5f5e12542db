"""The packed, seeded input pipeline (plain NumPy): documents -> one token stream -> fixed-length sequences.

Every document is tokenized without special tokens and followed by the separator token (EOS), the
stream is cut into ``seq_len``-token sequences, and the last partial sequence is padded (its padding is
masked out of the loss), so every corpus token is trained on exactly once per epoch. Within a
sequence, token t is predicted from tokens < t (the first token of a sequence has no prediction).

The batch of optimizer step s is a pure function of (s, seed): epoch e = s // steps_per_epoch uses the
permutation ``default_rng([seed, e])`` of the sequences (identity when ``shuffle`` is off), and a step
takes the next ``batch_size`` of them; an epoch's last short batch is filled with fully masked dummy rows.
No iterator state is kept, so resuming at step s reproduces the uninterrupted run's batches exactly.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from mia_jax.batching import pad_ids
from mia_jax.errors import UserError


def separator_id(tokenizer, eos_token_id: int | None, spec: str = "auto") -> int:
    """The document separator: ``<|endoftext|>`` when the vocabulary has it, else the model's EOS (``auto``),
    or the token named by ``spec``."""
    if spec != "auto":
        tid = tokenizer.token_to_id(spec)
        if tid is None:
            raise UserError(f"train.separator={spec!r} is not a token of this tokenizer")
        return tid
    tid = tokenizer.token_to_id("<|endoftext|>")
    if tid is not None:
        return tid
    if eos_token_id is None:
        raise UserError("the model has no EOS token and no <|endoftext|>: set train.separator to a token to use "
                        "between documents")
    return int(eos_token_id)


@dataclass
class PackedData:
    """Documents packed into fixed-length sequences: ``tokens`` and ``mask`` [N, seq_len], the real token count and the
    separator id."""
    tokens: np.ndarray  # int32 [N, seq_len]
    mask: np.ndarray  # bool [N, seq_len]: real tokens (False = padding of the last sequence)
    n_tokens: int  # real tokens, separators included
    separator: int

    @property
    def n_sequences(self) -> int:
        """The number of packed sequences."""
        return self.tokens.shape[0]

    def digest(self) -> str:
        """SHA-256 (hex) of the tokens and the mask: what the training fingerprint records."""
        h = hashlib.sha256(self.tokens.tobytes())
        h.update(self.mask.tobytes())
        return h.hexdigest()


def pack(documents: list[str], tokenizer, seq_len: int, separator: int) -> PackedData:
    """Tokenize and pack ``documents`` (see the module docstring)."""
    if not documents:
        raise UserError("the corpus has no documents")
    stream = []
    for enc in tokenizer.encode_batch(list(documents), add_special_tokens=False):
        stream.extend(enc.ids)
        stream.append(separator)
    n = len(stream)
    if n < seq_len:
        raise UserError(f"the corpus has {n} tokens, fewer than one training sequence (train.seq_len={seq_len}); "
                        "add background text (corpus.background_tokens) or lower train.seq_len")
    chunks = [stream[s: s + seq_len] for s in range(0, n, seq_len)]
    tokens, mask = pad_ids(chunks, len(chunks), seq_len, separator)  # only the last sequence has padding
    return PackedData(tokens, mask, n, separator)


@dataclass
class Batches:
    """Deterministic batches of ``data``: ``batch(step)`` -> (ids, mask), each [grad_accum, micro, seq_len]."""

    data: PackedData
    batch_size: int
    grad_accum: int = 1
    epochs: int = 1
    shuffle: bool = True
    seed: int = 0

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (the last batch padded with dummy rows)."""
        return math.ceil(self.data.n_sequences / self.batch_size)

    @property
    def total_steps(self) -> int:
        """Optimizer steps over every epoch."""
        return self.epochs * self.steps_per_epoch

    def order(self, epoch: int) -> np.ndarray:
        """The sequence order of ``epoch``: a seeded permutation when shuffling, else 0..N-1."""
        n = self.data.n_sequences
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)

    def indices(self, step: int) -> np.ndarray:
        """Sequence indices of a step's rows; -1 marks a dummy (fully masked) row."""
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} outside 0..{self.total_steps - 1}")
        epoch, i = divmod(step, self.steps_per_epoch)
        idx = self.order(epoch)[i * self.batch_size: (i + 1) * self.batch_size]
        return np.concatenate([idx, np.full(self.batch_size - len(idx), -1, idx.dtype)])

    def batch(self, step: int, rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of a step, [grad_accum, micro, seq_len]; ``rows``: only these rows of each micro-batch (a
        process's own block of a batch split over several hosts; only those rows are gathered)."""
        idx = self.indices(step).reshape(self.grad_accum, self.batch_size // self.grad_accum)
        if rows is not None:
            idx = idx[:, rows]
        real = idx >= 0
        ids = np.where(real[..., None], self.data.tokens[np.maximum(idx, 0)], self.data.separator).astype(np.int32)
        mask = real[..., None] & self.data.mask[np.maximum(idx, 0)]
        return ids, mask

"""The packed, seeded input pipeline: documents -> one token stream -> fixed-length sequences -> seeded batches.

Every document is tokenized without special tokens and followed by the separator token (EOS), the
stream is cut into ``seq_len``-token sequences, and the last partial sequence is padded (its padding is
masked out of the loss), so every corpus token is trained on exactly once per epoch. Within a
sequence, token t is predicted from tokens < t (the first token of a sequence has no prediction).
``pack_stream`` does this one sequence at a time (the trainer writes them to an ArrayRecord file,
train/grain_input.py); ``pack`` keeps them in memory.

The batch of optimizer step s is a pure function of (s, seed): epoch e = s // steps_per_epoch, and the step
takes the positions ``e * N + i * batch_size ...`` of the sampler (``i`` the step within the epoch), which
maps each position to a sequence. ``sampler="grain"``: ``grain.python.IndexSampler`` (shuffle=True, seed,
num_epochs), a seeded global shuffle with a new permutation each epoch; ``sampler="numpy"``: the permutation
``default_rng([seed, e])`` of each epoch, the order of the runs made before grain (the committed contamination
study); without ``shuffle``: 0..N-1 every epoch. An epoch's last short batch is filled with fully masked dummy
rows (index -1). No iterator state is needed to resume: the data position of step s is s (the trainer still
saves grain's iterator state in its checkpoints and checks it against the step).
"""
from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import grain.python as grain
import numpy as np

from mia_jax.batching import pad_ids
from mia_jax.errors import UserError

SAMPLERS = ("grain", "numpy")
ENCODE_CHUNK = 1024  # documents tokenized per call (one call's ids are what the packing holds at once)


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

    @property
    def seq_len(self) -> int:
        """Tokens per sequence."""
        return self.tokens.shape[1]

    def digest(self) -> str:
        """SHA-256 (hex) of the tokens and the mask: what the training fingerprint records."""
        h = hashlib.sha256(self.tokens.tobytes())
        h.update(self.mask.tobytes())
        return h.hexdigest()

    def rows(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, mask) of the sequences ``idx`` (any shape; -1 = a dummy row: separators, fully masked)."""
        real = idx >= 0
        tokens = np.where(real[..., None], self.tokens[np.maximum(idx, 0)], self.separator).astype(np.int32)
        return tokens, real[..., None] & self.mask[np.maximum(idx, 0)]


@dataclass
class PackInfo:
    """What ``pack_stream`` packed: sequences, real tokens, separator and ``PackedData.digest`` of the same packing."""
    n_sequences: int
    n_tokens: int
    seq_len: int
    separator: int
    sha256: str


def pack_stream(documents: Iterable[str], tokenizer, seq_len: int, separator: int,
                sink: Callable[[np.ndarray, np.ndarray], None] | None = None) -> PackInfo:
    """Tokenize and pack ``documents`` one sequence at a time (see the module docstring): ``sink(tokens, mask)`` gets
    each sequence (int32 and bool, [seq_len]) in order. The digest equals ``pack(...).digest()``: SHA-256 of every
    sequence's int32 tokens, then of every mask (kept as one count of real tokens per sequence)."""
    h, real = hashlib.sha256(), array("q")
    n_tokens = 0
    for chunk in _token_chunks(documents, tokenizer, seq_len, separator):
        tokens, mask = pad_ids([chunk], 1, seq_len, separator)
        h.update(tokens.tobytes())
        real.append(len(chunk))
        n_tokens += len(chunk)
        if sink is not None:
            sink(tokens[0], mask[0])
    if n_tokens < seq_len:
        raise UserError(f"the corpus has {n_tokens} tokens, fewer than one training sequence (train.seq_len="
                        f"{seq_len}); add background text (corpus.background_tokens) or lower train.seq_len")
    for n in real:
        h.update(np.arange(seq_len) < n)
    return PackInfo(len(real), n_tokens, seq_len, separator, h.hexdigest())


def _token_chunks(documents: Iterable[str], tokenizer, seq_len: int, separator: int) -> Iterator[list[int]]:
    """The token stream (each document's ids, then the separator) cut into ``seq_len`` pieces, the last one shorter."""
    buffer, docs, seen = [], [], False

    def encoded(batch):
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            yield from enc.ids
            yield separator

    def flush(batch):
        nonlocal buffer
        buffer.extend(encoded(batch))
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            buffer = buffer[seq_len:]

    for doc in documents:
        seen = True
        docs.append(doc)
        if len(docs) == ENCODE_CHUNK:
            yield from flush(docs)
            docs = []
    if not seen:
        raise UserError("the corpus has no documents")
    yield from flush(docs)
    if buffer:
        yield buffer


def pack(documents: list[str], tokenizer, seq_len: int, separator: int) -> PackedData:
    """Tokenize and pack ``documents`` into memory (see the module docstring)."""
    tokens, masks = [], []
    info = pack_stream(documents, tokenizer, seq_len, separator, lambda t, m: (tokens.append(t), masks.append(m)))
    return PackedData(np.stack(tokens), np.stack(masks), info.n_tokens, separator)


class NumpyOrder:
    """The order of the runs made before grain, as a grain sampler (``__getitem__(position) -> RecordMetadata``):
    epoch e = position // n is the permutation ``default_rng([seed, e])`` of the n sequences."""

    def __init__(self, n: int, epochs: int, seed: int):
        self.n, self.epochs, self.seed = n, epochs, seed
        self._cache = (None, None)  # (epoch, its permutation): one attribute, read and set at once (grain's threads)

    def __len__(self) -> int:
        return self.n * self.epochs

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        if not 0 <= index < len(self):
            raise IndexError(f"position {index} outside 0..{len(self) - 1}")
        epoch, (cached, perm) = index // self.n, self._cache
        if epoch != cached:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._cache = (epoch, perm)
        return grain.RecordMetadata(index=index, record_key=int(perm[index % self.n]))


def make_sampler(n: int, epochs: int, shuffle: bool, seed: int, sampler: str = "grain"):
    """The sampler of ``n`` sequences over ``epochs`` (position -> sequence; see the module docstring)."""
    if sampler not in SAMPLERS:
        raise UserError(f"train.sampler must be one of {SAMPLERS}, got {sampler!r}")
    if sampler == "numpy" and shuffle:
        return NumpyOrder(n, epochs, seed)
    if shuffle and not 0 <= seed < 2**32:
        raise UserError(f"train.seed must be in [0, 2**32) for grain's shuffle, got {seed}")
    return grain.IndexSampler(n, shuffle=shuffle, num_epochs=epochs, seed=seed if shuffle else None)


@dataclass
class Batches:
    """Deterministic batches of ``data`` (``PackedData`` in memory, or ``grain_input.RecordData`` read from an
    ArrayRecord file): ``batch(step)`` -> (ids, mask), each [grad_accum, micro, seq_len]."""

    data: PackedData
    batch_size: int
    grad_accum: int = 1
    epochs: int = 1
    shuffle: bool = True
    seed: int = 0
    sampler: str = "grain"  # "grain" | "numpy" (module docstring)

    @property
    def seq_len(self) -> int:
        """Tokens per sequence."""
        return self.data.seq_len

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (the last batch padded with dummy rows)."""
        return math.ceil(self.data.n_sequences / self.batch_size)

    @property
    def total_steps(self) -> int:
        """Optimizer steps over every epoch."""
        return self.epochs * self.steps_per_epoch

    def positions(self) -> grain.IndexSampler | NumpyOrder:
        """The sampler (memoised per data size, epochs, shuffle, seed and sampler)."""
        key = (self.data.n_sequences, self.epochs, self.shuffle, self.seed, self.sampler)
        memo = getattr(self, "_memo", None)  # (key, sampler): one attribute (read by grain's threads)
        if memo is None or memo[0] != key:
            memo = self._memo = (key, make_sampler(*key))
        return memo[1]

    def order(self, epoch: int) -> np.ndarray:
        """The sequence order of ``epoch`` (every sequence once)."""
        n, s = self.data.n_sequences, self.positions()
        return np.array([s[epoch * n + j].record_key for j in range(n)], np.int64)

    def indices(self, step: int) -> np.ndarray:
        """Sequence indices of a step's rows; -1 marks a dummy (fully masked) row."""
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} outside 0..{self.total_steps - 1}")
        epoch, i = divmod(step, self.steps_per_epoch)
        n, s = self.data.n_sequences, self.positions()
        first, last = i * self.batch_size, min((i + 1) * self.batch_size, n)
        idx = [s[epoch * n + j].record_key for j in range(first, last)]
        return np.array(idx + [-1] * (self.batch_size - len(idx)), np.int64)

    def batch(self, step: int, rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of a step, [grad_accum, micro, seq_len]; ``rows``: only these rows of each micro-batch (a
        process's own block of a batch split over several hosts; only those rows are read)."""
        return self.gather(self.indices(step), rows)

    def gather(self, index: np.ndarray, rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` from a step's ``indices``: (ids, mask) [grad_accum, micro (or ``rows`` of it), seq_len]."""
        idx = index.reshape(self.grad_accum, self.batch_size // self.grad_accum)
        return self.data.rows(idx if rows is None else idx[:, rows])

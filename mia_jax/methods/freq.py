"""Token-frequency tables of a reference corpus, counted with a model's own tokenizer (DC-PDD's f(x), Zhang et al.
2024, *Pretraining Data Detection for Large Language Models: A Divergence-based Calibration Method*).

A table holds ``counts[v]``, how often token id v occurs in the corpus when each document is tokenized as the
runner tokenizes a text (``tokenizer.encode`` with its default special tokens; the authors' ``tok.encode(text)``),
and the identity of the tokenizer that counted them: the SHA-256 of ``tokenizer.to_str()``. Token ids only mean
something for that tokenizer, so a table is refused (``UserError``) for a model with any other one
(``FreqTable.check_tokenizer``; ``FreqTable.load(path, tokenizer=...)``).

``probabilities()`` is the Laplace-smoothed (add-one) estimate of the paper, f(v) = (count(v) + 1) / (N + |V|),
N the corpus's token count and |V| the tokenizer's vocabulary size with its added tokens (the authors size the
table by the model's embedding rows instead, 50304 for Pythia; rows past the tokenizer never occur as text tokens,
so only the denominator differs, by their number).

Files: a compressed ``.npz`` with ``counts`` (int64 [V]) and ``meta`` (one JSON string: the tokenizer's SHA-256 and
the model it came from, the corpus files with their SHA-256, documents, tokens, options). Made by ``mia-jax
freq-table --model M [--corpus FILE ...] --out T.npz`` (:mod:`mia_jax.commands.freq_table`; the default corpus is
the bundled Pile sample).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mia_jax.batching import encode_ids
from mia_jax.data import corpora
from mia_jax.errors import UserError
from mia_jax.models import PACKAGED_MODELS, gguf_io, hf, resolve_model

FORMAT = "mia_jax.freq_table/1"
ENCODE_BATCH = 256  # documents per tokenizer.encode_batch call


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of the tokenizer's JSON serialisation (``tokenizers.Tokenizer.to_str()``): its identity."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def tokenizer_vocab_size(tokenizer) -> int:
    """Size of the table for a tokenizer: its vocabulary with the added (special) tokens."""
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def count_tokens(tokenizer, texts: Sequence[str], vocab_size: int, *, max_tokens: int | None = None,
                 progress: Callable[[int], object] | None = None) -> np.ndarray:
    """``counts[v]`` = occurrences of token id v over ``texts``, each tokenized with ``tokenizer.encode`` and its
    default special tokens (as the runner and the authors' ``tok.encode``), its first ``max_tokens`` tokens
    only when given (the authors count the first 1024). int64 ``[vocab_size]``; ``progress(n)`` after each ``n``
    documents. An id outside ``[0, vocab_size)`` is a ValueError (the vocabulary is too small)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    counts = np.zeros(vocab_size, np.int64)
    texts = list(texts)
    for start in range(0, len(texts), ENCODE_BATCH):
        chunk = texts[start:start + ENCODE_BATCH]
        ids = [np.asarray(one[:max_tokens], np.int64) for one in encode_ids(tokenizer, chunk)]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id {int(ids.max())} is outside a vocabulary of {vocab_size}")
        counts += np.bincount(ids, minlength=vocab_size)
        if progress is not None:
            progress(len(chunk))
    return counts


@dataclass(eq=False)
class FreqTable:
    """Token counts of a reference corpus and the tokenizer that counted them (see the module docstring).

    ``counts``: int64 ``[V]``; ``tokenizer_sha256``: ``tokenizer_sha256(tokenizer)``; ``tokenizer_name``: the model
    (or tokenizer file) it came from, for messages; ``corpus_files``: {path: SHA-256}; ``meta``: the rest (documents,
    options). ``path``: the file it was loaded from or saved to (None for one in memory).
    """

    counts: np.ndarray
    tokenizer_sha256: str
    tokenizer_name: str = ""
    corpus_files: dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    path: str | None = None

    def __post_init__(self):
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or counts.size == 0 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
            raise ValueError("counts must be a non-empty 1-D array of non-negative integers")
        self.counts = counts.astype(np.int64)

    @classmethod
    def from_texts(cls, tokenizer, texts: Sequence[str], *, name: str = "", max_tokens: int | None = None,
                   corpus_files: dict[str, str] | None = None) -> FreqTable:
        """Count ``texts`` with ``tokenizer`` (``count_tokens``) into a table tied to that tokenizer."""
        counts = count_tokens(tokenizer, texts, tokenizer_vocab_size(tokenizer), max_tokens=max_tokens)
        return cls(counts, tokenizer_sha256(tokenizer), name, dict(corpus_files or {}),
                   {"n_documents": len(texts), "max_tokens": max_tokens})

    @property
    def vocab_size(self) -> int:
        """The number of token ids the table counts."""
        return int(self.counts.size)

    @property
    def total(self) -> int:
        """N, the corpus's token count."""
        return int(self.counts.sum())

    @property
    def n_distinct(self) -> int:
        """The number of token ids seen at least once."""
        return int(np.count_nonzero(self.counts))

    @cached_property
    def _probabilities(self) -> np.ndarray:
        p = (self.counts + 1.0) / float(self.total + self.vocab_size)
        p.setflags(write=False)
        return p

    def probabilities(self) -> np.ndarray:
        """Laplace-smoothed token frequencies f(v) = (count(v) + 1) / (N + V), float64 ``[V]`` (read-only)."""
        return self._probabilities

    def sha256(self) -> str:
        """Digest of what the scores depend on (the format, the tokenizer's identity, the counts): the run
        fingerprint's entry for the table."""
        h = hashlib.sha256(f"{FORMAT}\n{self.tokenizer_sha256}\n{self.vocab_size}\n".encode())
        h.update(self.counts.astype("<i8").tobytes())
        return h.hexdigest()

    def check_tokenizer(self, tokenizer, name: str | None = None) -> None:
        """UserError unless ``tokenizer`` (a model's, named ``name`` in the message) is the one that counted it."""
        got = tokenizer_sha256(tokenizer)
        if got == self.tokenizer_sha256:
            return
        where = f"frequency table {self.path}" if self.path else "the frequency table"
        made = f"the tokenizer of {self.tokenizer_name!r}" if self.tokenizer_name else "another tokenizer"
        model = f"model {name!r}" if name else "the model"
        raise UserError(
            f"{where} was counted with {made} (tokenizer SHA-256 {self.tokenizer_sha256[:12]}), but {model} has a "
            f"different tokenizer (SHA-256 {got[:12]}); token ids differ between tokenizers: make a table for this "
            f"model with `mia-jax freq-table --model {name or 'M'} --corpus FILE --out T.npz`")

    def to_meta(self) -> dict:
        """The table's metadata as saved beside its counts (format, tokenizer, sizes, corpus files)."""
        return {**self.meta, "format": FORMAT, "tokenizer_sha256": self.tokenizer_sha256,
                "tokenizer_name": self.tokenizer_name, "vocab_size": self.vocab_size, "total": self.total,
                "n_distinct": self.n_distinct, "corpus_files": self.corpus_files}

    def save(self, path: str | os.PathLike) -> Path:
        """Write a compressed .npz (``counts`` + ``meta`` JSON) atomically (a temporary file + rename)."""
        path = Path(path)
        buf = io.BytesIO()
        np.savez_compressed(buf, counts=self.counts, meta=np.array(json.dumps(self.to_meta(), sort_keys=True)))
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
        self.path = str(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer=None, name: str | None = None) -> FreqTable:
        """Read a table written by ``save``; with ``tokenizer`` (the model's) refuse one counted with another
        (``check_tokenizer``; ``name`` names the model in the message)."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"frequency table not found: {path}; make one with `mia-jax freq-table --model M "
                            "--corpus FILE --out T.npz`")
        bad = f"{path} is not a token-frequency table written by `mia-jax freq-table`"
        try:
            with np.load(path, allow_pickle=False) as z:
                counts, meta = z["counts"], json.loads(str(z["meta"]))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{bad} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise UserError(f"{bad} (format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                            f"expected {FORMAT!r})")
        try:
            table = cls(counts, meta["tokenizer_sha256"], meta.get("tokenizer_name", ""),
                        dict(meta.get("corpus_files") or {}), path=str(path),
                        meta={k: v for k, v in meta.items() if k not in _DERIVED})
        except (KeyError, ValueError) as e:
            raise UserError(f"{bad} ({e})") from None
        if meta.get("total") != table.total or meta.get("vocab_size") != table.vocab_size:
            raise UserError(f"{path}: the counts do not match the recorded totals (file damaged); make the table "
                            "again")
        if tokenizer is not None:
            table.check_tokenizer(tokenizer, name)
        return table


_DERIVED = ("format", "tokenizer_sha256", "tokenizer_name", "vocab_size", "total", "n_distinct", "corpus_files")


def load(path: str | os.PathLike, tokenizer=None, name: str | None = None) -> FreqTable:
    """``FreqTable.load``: read a table; with the model's ``tokenizer``, refuse one counted with another."""
    return FreqTable.load(path, tokenizer, name)


def for_model(path: str | os.PathLike, loaded) -> FreqTable:
    """The table at ``path`` for a ``models.LoadedModel``: refused unless its tokenizer counted it."""
    return FreqTable.load(path, loaded.tokenizer, loaded.name)


# ----------------------------------------------------------------------------- what `mia-jax freq-table` reads

def default_corpus() -> Path:
    """The bundled Pile sample (600 Pile test-split documents; mia_jax/data/files/LICENSE.md), the same file the
    contamination experiments' ``bundled:pile_sample.jsonl`` names."""
    path = corpora.PILE_SAMPLE
    if not path.is_file():
        raise UserError(f"the bundled Pile sample is not installed ({path}); pass --corpus FILE")
    return path


def load_tokenizer(model: str, tokenizer_path: str | None = None, allow_download: bool = False):
    """(tokenizer, model label) of a model without reading its weights: the tokenizer ``models.load`` gives it
    (``tokenizer_path``, else the folder's tokenizer.json, else the one the GGUF metadata describes), and the
    label ``LoadedModel.name`` gives it."""
    source = Path(resolve_model(model, allow_download=allow_download))
    if tokenizer_path:
        file = Path(tokenizer_path).expanduser()
        file = file / "tokenizer.json" if file.is_dir() else file
    elif source.is_dir():
        file = source / "tokenizer.json"
    else:
        with open(source, "rb") as f:
            if f.read(4) != b"GGUF":
                raise UserError(f"{source}: neither a Hugging Face model folder nor a GGUF file")
        file = None
    if file is not None and not file.exists():
        raise UserError(f"no tokenizer found at {file}; pass --tokenizer a tokenizer.json")
    tok = hf.read_tokenizer(file) if file is not None else gguf_io.tokenizer_from_gguf(
        gguf_io.read_metadata(str(source)), str(source))
    return tok, model if model in PACKAGED_MODELS else source.name

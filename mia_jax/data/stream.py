"""Texts read in a bounded window: JSONL / CSV / TSV a line at a time, Parquet a row group at a time
(``data.parquet_rows``), TFDS through ``mia_jax.data.tfds_source.TfdsSource`` (random access, ``rows(start)``), so
that scoring a corpus never holds more than one window of its texts.

:class:`TextStream` is one input (a file or a ``tfds:NAME[/CONFIG][:SPLIT]`` spec) with the same field rules and errors
as :func:`mia_jax.data.load_records` (one row check, ``data.record``: the text field is ``--text-field``, else the one
of ``text`` / ``input`` the first row has; labels 0 / 1). Its :meth:`TextStream.scan` is the streaming first pass a run
needs before it claims its folder: the number of texts, the SHA-256 of the texts and labels (the same digest as
``runner.run_fingerprint`` computes over the lists, so a run's fingerprint does not depend on how its texts were read),
the labels (one small integer per text) and the exact-duplicate report (``data.duplicate_report``'s fields, from one
64-bit hash per text). :meth:`TextStream.windows` yields the texts again, ``size`` at a time, from any window on;
``max_held`` counts the most texts it ever held at once (what the tests check, not memory).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import islice
from typing import Iterator

import numpy as np

from mia_jax import data
from mia_jax.data import sample
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256

TFDS_PREFIX = "tfds:"


def is_tfds(spec) -> bool:
    """Whether ``spec`` names a TFDS dataset (``tfds:NAME[/CONFIG][:SPLIT]``) rather than a file."""
    return str(spec).startswith(TFDS_PREFIX)


@dataclass
class Scan:
    """What the first pass over an input found: ``n`` texts, ``texts_sha256`` (``runner.run_fingerprint``'s digest),
    ``labels`` (int8 [n], or None unlabeled), ``duplicates`` (``data.duplicate_report``'s dict) and the ``texts``
    themselves when there were no more than the pass was asked to keep (else None)."""
    n: int
    texts_sha256: str
    labels: np.ndarray | None
    duplicates: dict
    texts: list[str] | None = None


class TextStream:
    """One input read row by row: ``spec`` (a data file, or a ``tfds:`` spec read from ``data_dir``), the
    ``text_field`` (None: ``text`` or ``input``, ``data.default_text_field``), ``label_field`` (None: unlabeled),
    the text files' ``encoding``, at most ``limit`` texts. ``name`` and ``files`` ({path: SHA-256}) as a
    ``data.Dataset``'s."""

    def __init__(self, spec, text_field: str | None = None, label_field: str | None = "label", *,
                 encoding: str = "utf-8", limit: int | None = None, data_dir=None):
        self.spec, self.label_field, self.encoding, self.limit = spec, label_field, encoding, limit
        self.text_field = text_field
        self.max_held = 0
        self.keep: np.ndarray | None = None  # the rows read (sorted), when --limit sampled them (``apply_limit``)
        if is_tfds(spec):
            self._tfds = src = _tfds_source(str(spec), data_dir)
            self.name, self.files, self.path = src.label, dict(src.files), str(spec)
            self.text_field = src.resolve_text_field(self.text_field)
            if label_field is not None:
                src.check_label_field(label_field)
        else:
            data.check_encoding(encoding)
            self._tfds = None
            self.path = data.check_data_file(spec)
            self.name = self.path.stem
            self.files = {str(self.path): sha256(self.path)}

    def rows(self, start: int = 0) -> Iterator[tuple[str, int | None]]:
        """(text, label or None) of every row from row ``start`` on (up to ``limit`` rows in all; with ``keep``, the
        rows it names alone, ``start`` counting those), checked as ``data.load_records`` checks them."""
        if self.keep is not None:
            yield from self._kept_rows(start)
            return
        stop = self.limit
        raw = self._raw(start)
        if stop is not None:
            raw = islice(raw, max(stop - start, 0))
        for where, row in raw:
            yield self._record(row, where)

    def apply_limit(self) -> str:
        """``--limit`` on this input (``sample.limit_rows``): unlabeled, the first ``limit`` rows; labeled, a first
        pass reads every label and ``keep`` becomes a seeded stratified sample of ``limit`` rows (read in file
        order). Returns the note that says how the rows were chosen ('' when all are kept)."""
        if self.limit is None or self.label_field is None:
            return ""
        limit, self.limit = self.limit, None
        labels = [label for _, label in self.rows()]
        self.keep = sample.limit_rows(labels, len(labels), limit)
        return sample.describe_limit(labels, limit, len(labels))

    def _kept_rows(self, start: int) -> Iterator[tuple[str, int | None]]:
        """The rows of ``keep`` from its ``start``-th on."""
        wanted = self.keep[start:]
        if not len(wanted):
            return
        j, first = 0, int(wanted[0])
        for i, (where, row) in enumerate(self._raw(first), start=first):
            if i == wanted[j]:
                yield self._record(row, where)
                j += 1
                if j == len(wanted):
                    return

    def windows(self, size: int, start: int = 0) -> Iterator[tuple[int, list[str], list[int] | None]]:
        """(index of the first text, ``size`` texts or fewer at the end, their labels or None) from text ``start``
        (a multiple of ``size``) on; never more than ``size`` texts held (``max_held``)."""
        texts: list[str] = []
        labels: list[int] = []
        first = start
        for text, label in self.rows(start):
            texts.append(text)
            labels.append(label)
            self.max_held = max(self.max_held, len(texts))
            if len(texts) == size:
                yield first, texts, (labels if self.label_field is not None else None)
                first += size
                texts, labels = [], []
        if texts:
            yield first, texts, (labels if self.label_field is not None else None)

    def scan(self, keep: int = 0) -> Scan:
        """The first pass: every row read once and checked, nothing but one label and one 64-bit hash per text
        kept (see the module docstring), and the texts while there are no more than ``keep`` of them (an input that
        fits one window is then not read again). A UserError for an input without a row."""
        digest = hashlib.sha256(b"[[")
        labels: list[int] = []
        hashes: list[int] = []
        kept: list[str] | None = []
        for i, (text, label) in enumerate(self.rows()):
            if kept is not None and len(kept) == keep:
                kept = None  # more than ``keep``: read again later, a window at a time
            elif kept is not None:
                kept.append(text)
                self.max_held = max(self.max_held, len(kept))
            digest.update(((", " if i else "") + json.dumps(text, ensure_ascii=False)).encode("utf-8"))
            hashes.append(int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little"))
            if label is not None:
                labels.append(label)
        if not hashes:
            raise UserError(f"{self.spec}: no rows (the input is empty or holds only blank lines or a header); give "
                            "one with at least one row")
        lab = np.asarray(labels, np.int8) if self.label_field is not None else None
        digest.update(("], " + (json.dumps(labels) if lab is not None else "null") + "]").encode("utf-8"))
        return Scan(len(hashes), digest.hexdigest(), lab, duplicates(np.asarray(hashes, np.uint64), lab), kept)

    def dataset(self, scan: Scan) -> data.Dataset:
        """The ``data.Dataset`` of an input whose ``scan`` kept its texts (as ``data.load`` would read it)."""
        labels = scan.labels.tolist() if scan.labels is not None else None
        return data.Dataset(scan.texts, labels, self.name, dict(self.files), {}, self.text_field)

    def texts(self) -> list[str]:
        """Every text in a list (what a method that needs all of them at once reads, e.g. the blind baseline)."""
        return [t for t, _ in self.rows()]

    def _record(self, row, where) -> tuple[str, int | None]:
        text, label, self.text_field = data.record(row, self.path, where, self.text_field, self.label_field)
        return text, label

    def _raw(self, start: int) -> Iterator[tuple[int, object]]:
        """(row number from 1, raw row) from row ``start`` on."""
        if self._tfds is not None:
            return ((start + k + 1, row) for k, row in enumerate(self._tfds.rows(start)))
        if self.path.suffix.lower() == ".parquet":
            return data.parquet_rows(self.path, start)
        return islice(data.read_rows(self.path, self.encoding), start, None)


def duplicates(hashes: np.ndarray, labels: np.ndarray | None, max_examples: int = 5) -> dict:
    """``data.duplicate_report``'s dict from one 64-bit hash per text (equal hashes: equal texts) and the labels."""
    order = np.argsort(hashes, kind="stable")
    h = hashes[order]
    new = np.ones(len(h), bool)
    new[1:] = h[1:] != h[:-1]
    group = np.cumsum(new) - 1
    firsts = order[new][group]  # each text's first occurrence
    dup_rows = np.flatnonzero(firsts[np.argsort(order)] != np.arange(len(hashes)))
    first_of = firsts[np.argsort(order)]
    examples = [[int(i), int(first_of[i])] for i in dup_rows[:max_examples]]
    conflicting: list[list[int]] = []
    if labels is not None and len(dup_rows):
        lab = labels[order].astype(np.int64)
        lo = np.minimum.reduceat(lab, np.flatnonzero(new))
        hi = np.maximum.reduceat(lab, np.flatnonzero(new))
        bad = np.flatnonzero(lo != hi)  # groups with both labels, ordered by their first row below
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], len(h))
        groups = sorted((sorted(order[starts[g]:ends[g]].tolist()) for g in bad), key=lambda rows: rows[0])
        conflicting = groups
    return {"n_texts": int(len(hashes)), "n_duplicate_texts": int(len(dup_rows)),
            "n_conflicting_texts": len(conflicting), "duplicate_examples": examples,
            "conflicting_examples": [[int(i) for i in g] for g in conflicting[:max_examples]]}


def _tfds_source(spec: str, data_dir):
    """The ``TfdsSource`` of a ``tfds:`` spec. Imported here: tensorflow-datasets is loaded only for TFDS input."""
    try:
        from mia_jax.data import tfds_source  # loads tensorflow-datasets: only for tfds: specs
    except ImportError as e:
        raise UserError(f"{spec}: reading TFDS datasets needs tensorflow-datasets ({e})") from None
    return tfds_source.TfdsSource(spec, data_dir=data_dir)


class StreamDataset:
    """A corpus to score a window at a time, in the place of a ``data.Dataset``: its ``stream``, the ``scan`` of its
    first pass and the ``window`` (texts per shard); ``name``, ``files``, ``labels`` (int8 [n] or None),
    ``text_field`` and ``duplicates`` as the scan found them. ``texts`` is None: they are read again, a window at a
    time, by ``mia_jax.engine.shards.score_stream`` (or some of them by :meth:`texts_at`: the blind baseline's
    sample)."""
    texts = None
    extra: dict = {}

    def __init__(self, stream: TextStream, scan: Scan, window: int):
        self.stream, self.scan, self.window = stream, scan, window
        self.name, self.files, self.labels = stream.name, stream.files, scan.labels
        self.text_field, self.duplicates = stream.text_field, scan.duplicates

    def __len__(self) -> int:
        return self.scan.n

    def texts_at(self, indices) -> list[str]:
        """The texts at the sorted ``indices``, read in one pass that keeps those alone."""
        want, out = iter(int(i) for i in indices), []
        nxt = next(want, None)
        for i, (text, _) in enumerate(self.stream.rows()):
            if nxt is None:
                break
            if i == nxt:
                out.append(text)
                nxt = next(want, None)
        return out

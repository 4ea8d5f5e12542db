"""Streaming scoring: a corpus scored one window of texts at a time into numbered shards, so that memory does not
grow with the number of texts and a killed run resumes from every finished shard.

Layout of ``<out>/passes/main/``: ``00000.jsonl``, ``00001.jsonl``, ... (shard k: the records of texts
``k * window`` .. ``(k + 1) * window - 1``, global indices, the same records as the single-file path writes), and
``index.json``: the window, the number of texts, the methods and per finished shard its file, first and last text
index and SHA-256. A shard is written whole (temporary file + rename) and only then entered in the index; the shard
being scored appends its finished steps to ``<k>.partial.jsonl`` (``runner.score_texts``' own resume, indices
within the window), so a kill at any moment loses at most the steps in flight. A resumed run checks every shard
of the index against its SHA-256, reuses the finished ones without reading their texts again (the reader skips to
the first unfinished window) and rescores from the first missing or damaged one. At the end ``<out>/results.jsonl``
is the shards' concatenation (streamed, never held).

What stays in memory is one window of texts, their tokens and records, plus :class:`Columns`: per text its label,
one float64 per method and a few counts -- what ``eval``'s metrics and bootstraps read. Each window is planned on
its own (``batching.pack``) into rows of one length with the first window's (``plan_shape``), each step padded
with empty rows and segments (as ``batching.align`` feeds them) to a full step of at least the first window's
segments (``stable_steps``), so the windows share one or two compiled programs whatever the corpus's size.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.runs import processes
from mia_jax.batching import encode, pack, pow2, scoring_lengths
from mia_jax.runs.files import sha256, write_jsonl

INDEX = "index.json"


@dataclass
class Columns:
    """What a report needs of a run's records, without the records: ``labels`` (int8 [n] or None), ``scores``
    {method: float64 [n], NaN where null}, and the counts ``n_tokens``, ``n_skipped``, ``n_truncated`` and the
    indices of the texts with non-finite logits (``nonfinite``)."""
    n: int
    methods: Sequence[str]
    labels: np.ndarray | None
    scores: dict = field(default_factory=dict)
    n_tokens: int = 0
    n_skipped: int = 0
    n_truncated: int = 0
    nonfinite: list = field(default_factory=list)

    def __post_init__(self):
        self.scores = self.scores or {m: np.full(self.n, np.nan) for m in self.methods}

    def take(self, records: Sequence[dict], nonfinite_reason: str) -> None:
        """The records' scores and counts entered (each at its ``index``)."""
        for r in records:
            i = r["index"]
            for m in self.methods:
                v = r["scores"][m]
                self.scores[m][i] = np.nan if v is None else v
            self.n_tokens += r["n_tokens"]
            self.n_truncated += bool(r.get("truncated"))
            if "skip_reason" in r:
                self.n_skipped += 1
                if r["skip_reason"].startswith(nonfinite_reason):
                    self.nonfinite.append(i)


def columns_of(records: Sequence[dict], methods: Sequence[str], nonfinite_reason: str) -> Columns:
    """The :class:`Columns` of records held in memory (the single-file path)."""
    labels = np.asarray([r["label"] for r in records], np.int8) if records and "label" in records[0] else None
    cols = Columns(len(records), list(methods), labels)
    cols.take(records, nonfinite_reason)
    return cols


def shard_name(k: int) -> str:
    """Shard ``k``'s file name."""
    return f"{k:05d}.jsonl"


def finished_shards(folder: Path, window: int, n_texts: int, methods: Sequence[str]) -> tuple[list[dict], tuple | None]:
    """The index's entries of the shards that are on disk intact (SHA-256), in order, up to the first that is not,
    and the run's (row length, segments); ([], None) without an index or with one of another layout."""
    try:
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], None
    if (index.get("window"), index.get("n_texts"), index.get("methods")) != (window, n_texts, list(methods)):
        return [], None
    kept = []
    for k, entry in enumerate(index.get("shards", [])):
        path = folder / shard_name(k)
        if entry.get("file") != path.name or not path.is_file() or sha256(path) != entry.get("sha256"):
            break
        kept.append(entry)
    shape = (index.get("row_length"), index.get("segments"))
    return kept, shape if kept and None not in shape else None


def plan_shape(loaded, texts: Sequence[str], tokens_per_batch: int) -> tuple[int, int]:
    """(row length, segments) of a streamed run's packed rows: the length of most steps (the shorter of a tie) that
    ``batching.pack`` plans for ``texts``, its first window, and the most texts in a row of that length (a power of
    two): every window is packed alike (``stable_steps``)."""
    steps = pack(scoring_lengths(encode(loaded, texts)), tokens_per_batch, loaded.max_length)
    counts = Counter(s.length for s in steps)
    if not counts:
        return min(tokens_per_batch, loaded.max_length), 1
    length = min(counts, key=lambda n: (-counts[n], n))
    return length, pow2(max(s.segments for s in steps if s.length == length))


def _write_index(folder: Path, window: int, n_texts: int, methods: Sequence[str], shape: tuple[int, int],
                 shards: list[dict]) -> None:
    tmp = folder / f"{INDEX}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"window": window, "n_texts": n_texts, "methods": list(methods), "row_length": shape[0],
                               "segments": shape[1], "shards": shards}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / INDEX)


def _read_shard(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def score_stream(loaded, stream, scan, methods: Sequence[str], *, window: int, out_dir, resume: bool,
                 report: dict | None = None, desc: str = "scoring", nonfinite_reason: str = "",
                 **kwargs) -> Columns:
    """Score every text of ``stream`` with the single-pass ``methods``, ``window`` texts at a time, into the shards
    of ``out_dir/passes/main/`` and ``out_dir/results.jsonl`` (see the module docstring).

    Args:
        loaded, methods: the model (``models.load``) and the single-pass method names.
        stream, scan: a ``data.stream.TextStream`` and its first pass (``stream.scan()``: the texts' number, labels).
        window, out_dir: the texts per shard and the run folder.
        resume: reuse the finished shards (checked against their SHA-256) and the partial one's steps.
        report: a dict, filled in: ``score_texts``' counts summed over the windows (``reused`` and ``skipped``
            include the reused shards' texts) and ``shards`` / ``shards_reused``.
        desc: the progress bar's label.
        nonfinite_reason: the skip reason of a text with non-finite logits (counted in ``Columns.nonfinite``).
        **kwargs: go to ``runner.score_texts``.

    Returns:
        The run's :class:`Columns`: labels int8 [n] or None, scores {method: float64 ``np.ndarray`` [n]}, counts.
    """
    from mia_jax.runs import preemption  # here, not at the top: the model code; the report imports Columns early
    from mia_jax.engine import runner

    folder, main = Path(out_dir, "passes", "main"), processes.is_main_process()
    if main:  # on several processes process 0 alone writes the shards, the index and results.jsonl
        if not resume and folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in [*folder.glob(f"{INDEX}.*.tmp"), *Path(out_dir).glob("results.jsonl.*.tmp")]:  # a killed run's
            stale.unlink(missing_ok=True)
    n_shards = -(-scan.n // window)
    done, shape = finished_shards(folder, window, scan.n, methods) if resume and main else ([], None)
    done, shape = processes.broadcast_json([done, shape])  # every process skips the windows process 0 has finished
    folder.mkdir(parents=True, exist_ok=True)  # the others' own records of a window go here (``records.Sink``)
    if shape is None:
        budget = kwargs.get("tokens_per_batch") or runner.default_tokens_per_batch()
        shape = plan_shape(loaded, next(stream.windows(window))[1], budget)
    cols = Columns(scan.n, list(methods), scan.labels)
    counts = {"texts": scan.n, "reused": 0, "computed": 0, "batches_computed": 0, "skipped": 0, "slots": 0,
              "tokens": 0, "scoring_programs": 0, "shards": n_shards, "shards_reused": len(done)}
    for k, entry in enumerate(done if main else ()):
        (folder / f"{k:05d}.partial.jsonl").unlink(missing_ok=True)  # a kill between the index and this unlink
        recs = _read_shard(folder / entry["file"])
        cols.take(recs, nonfinite_reason)
        skipped = sum("skip_reason" in r for r in recs)
        counts["skipped"] += skipped
        counts["reused"] += len(recs) - skipped
    if done and main:
        print(f"{desc}: resuming from {folder}: {len(done)} of {n_shards} shards finished "
              f"({done[-1]['last'] + 1} of {scan.n} texts), reused", file=sys.stderr, flush=True)
    shapes: set = set()
    shards = list(done)
    for first, texts, labels in stream.windows(window, start=len(done) * window):
        k = first // window
        partial = folder / f"{k:05d}.partial.jsonl"
        part: dict = {}
        try:  # on several processes each tokenizes and scores its own slice of the window (``runner``)
            recs = runner.score_texts(loaded, texts, methods, labels=labels, out_path=partial, resume=True,
                                      report=part, desc=f"{desc} (shard {k + 1}/{n_shards})", shapes=shapes,
                                      stable=shape, **kwargs)
        except preemption.Preempted as e:
            raise preemption.Preempted(f"{k} of {n_shards} windows and {e.progress} of window {k + 1}") from None
        recs = [dict(r, index=first + r["index"]) for r in recs]
        if main:
            path = folder / shard_name(k)
            write_jsonl(path, recs)
            shards.append({"file": path.name, "first": first, "last": first + len(texts) - 1,
                           "sha256": sha256(path)})
            _write_index(folder, window, scan.n, methods, shape, shards)
            partial.unlink(missing_ok=True)
        cols.take(recs, nonfinite_reason)
        for key in ("reused", "computed", "batches_computed", "skipped", "slots", "tokens"):
            counts[key] += part[key]
    counts["scoring_programs"] = len(shapes)
    if report is not None:
        report.update(counts)
    if main:
        _concatenate([folder / e["file"] for e in shards], Path(out_dir, "results.jsonl"))
    return cols


def _concatenate(parts: Sequence[Path], out: Path) -> None:
    """``out`` written as the concatenation of ``parts`` (temporary file + rename; one part in memory at a time)."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for p in parts:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, f)
        os.replace(tmp, out)
    except BaseException:  # disk full, Ctrl-C: no temporary left behind
        tmp.unlink(missing_ok=True)
        raise


"""The record sink of a scoring pass: one JSON record per text, appended as each step finishes, reused on resume,
gathered from every process at the end.

A record: ``index``, ``label`` (when labeled), ``n_tokens``, ``n_context`` (a prefix's tokens, read and not
scored), ``scores`` {method: float or null}, ``truncated`` and ``skip_reason`` when they apply. NaN is not JSON: a
missing score is null and the record (or the pass's ``nan_reasons``) says why.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Sequence

import jax

from mia_jax.runs import processes
from mia_jax.errors import UserError
from mia_jax.runs.files import write_jsonl


def json_score(v) -> float | None:
    """``v`` as a JSON score: a float, or None when it is None, NaN or infinite."""
    return None if v is None or not math.isfinite(v) else float(v)


def skip_reason(text: str, n_tokens: int) -> str | None:
    """Why a text gets no scores (None: it is scored)."""
    if not text.strip():
        return "empty or whitespace-only text"
    if n_tokens < 2:
        return f"fewer than 2 tokens ({n_tokens}): nothing to predict"
    return None


def make_record(index: int, label, enc, scores: dict[str, float], skip: str | None) -> dict:
    """The record of text ``index`` (``enc``: its ``runner.Encoded``)."""
    rec = {"index": index}
    if label is not None:
        rec["label"] = int(label)
    rec["n_tokens"] = len(enc.ids)
    if enc.n_context:
        rec["n_context"] = enc.n_context  # of n_tokens, the prefix's (read, not scored)
    rec["scores"] = {m: json_score(v) for m, v in scores.items()}
    if enc.truncated:
        rec["truncated"] = True
    if skip:
        rec["skip_reason"] = skip
    return rec


def read_done(path: str | os.PathLike, n_texts: int, methods: Sequence[str]) -> dict[int, dict]:
    """Records already in a results file from an interrupted run, by index.

    A torn last line (the process was killed mid-write) is ignored; a record for another set of
    methods or an index out of range means the file belongs to a different run (UserError).
    """
    done: dict[int, dict] = {}
    path = Path(path)
    if not path.exists():
        return done
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn write
        if not (isinstance(rec, dict) and 0 <= rec.get("index", -1) < n_texts and list(rec["scores"]) == list(methods)):
            raise UserError(f"{path}: line {lineno} does not belong to this run (other data or methods); "
                            "use another --out or --overwrite")
        done[rec["index"]] = rec
    return done


class Sink:
    """The records of one pass over ``n_texts`` texts, of which this process handles ``mine``.

    ``out_path`` (optional): records are appended as they are added (a crash loses at most the steps in flight);
    on several processes each appends to its own ``<out_path>.process<i>-of-<n>``. ``resume``: the records
    already there (``read_done``) are kept. ``finish()`` gathers every process's records and (process 0) rewrites
    ``out_path`` in input order; it returns all of them."""

    def __init__(self, out_path, n_texts: int, methods: Sequence[str], mine: Sequence[int], *, resume: bool,
                 multi: bool):
        self.out_path, self.n_texts, self.mine, self.multi = out_path, n_texts, list(mine), multi
        self.path = (Path(f"{out_path}.process{jax.process_index()}-of-{jax.process_count()}")
                     if multi and out_path else out_path)
        self.records: dict[int, dict] = {}
        if out_path and resume:
            done = read_done(out_path, n_texts, methods)
            if multi:
                done.update(read_done(self.path, n_texts, methods))
            own = set(self.mine)
            self.records = {i: r for i, r in done.items() if i in own}
        self._file = None

    def __contains__(self, index: int) -> bool:
        return index in self.records

    def open(self) -> None:
        """Start the file from exactly the records kept so far."""
        if self.path:
            write_jsonl(self.path, [self.records[i] for i in sorted(self.records)])
            self._file = open(self.path, "a", encoding="utf-8")

    def add(self, records: Sequence[dict]) -> None:
        """``records`` kept and, with a file, appended to it and flushed."""
        for rec in records:
            self.records[rec["index"]] = rec
        if self._file:
            self._file.write("".join(json.dumps(r) + "\n" for r in records))
            self._file.flush()

    def close(self) -> None:
        """The file closed (if open)."""
        if self._file:
            self._file.close()
            self._file = None

    def finish(self) -> list[dict]:
        """Every record in input order (gathered from every process when multi-process); process 0 rewrites the file in
        that order."""
        self.close()
        records = self.records
        if self.multi:
            parts = processes.allgather_json([records[i] for i in self.mine])
            records = {r["index"]: r for part in parts for r in part}
        ordered = [records[i] for i in range(self.n_texts)]
        if self.out_path and processes.is_main_process():
            write_jsonl(self.out_path, ordered)
        if self.multi and self.out_path:
            processes.sync(f"score_texts:{Path(self.out_path).name}")  # the same name on every host, whatever its --out
            Path(self.path).unlink(missing_ok=True)
        return ordered

"""The per-example records of a contamination run (``examples.jsonl.gz`` beside ``run.json``): every table and
figure of a run, or of a sweep of runs, is a function of those two files alone."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mia_jax.evaluation import blind
from mia_jax.runs import files

EXAMPLES = "examples.jsonl.gz"
RUN = "run.json"
RUN_FILES = (RUN, EXAMPLES)  # what a rebuild reads of a run: sealed at the run's end (rundir.seal)


def example_rows(eval_set: list[dict], trained: list[dict], base: list[dict], seed: int = 0) -> list[dict]:
    """One row per eval example: its eval fields except the text, ``text_sha256``, ``blind`` (the out-of-fold score
    of the blind baseline fitted on its dataset's texts alone, null when the dataset is too small) and ``trained`` /
    ``base``: {method: score or null} from the two models' scoring records."""
    rows = []
    for e, t, b in zip(eval_set, trained, base, strict=True):
        row = {k: v for k, v in e.items() if k != "text"}
        row["text_sha256"] = hashlib.sha256(e["text"].encode("utf-8")).hexdigest()
        row.update(n_tokens=t.get("n_tokens"), blind=None, trained=t["scores"], base=b["scores"])
        rows.append(row)
    for d, idx in by_dataset(rows).items():
        try:
            scores = blind.blind_bow_scores([eval_set[i]["text"] for i in idx], [rows[i]["label"] for i in idx],
                                            seed=seed)
        except Exception:  # noqa: BLE001 - too few examples for the cross-validation: no blind score
            continue
        for i, s in zip(idx, scores):
            rows[i]["blind"] = float(s)
    return rows


def write_examples(path: Path, rows: list[dict]) -> None:
    """``rows`` as gzip-compressed JSONL, byte-identical for the same rows (``files.write_jsonl_gz``)."""
    files.write_jsonl_gz(path, rows)


def read_examples(path: Path) -> list[dict]:
    """The rows of an ``examples.jsonl.gz`` (``files.read_jsonl_gz``)."""
    return files.read_jsonl_gz(path)


def by_dataset(rows: list[dict]) -> dict[str, list[int]]:
    """{dataset: indices of its rows}, datasets in order of first appearance."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        out.setdefault(r["dataset"], []).append(i)
    return out


def score_vector(rows: list[dict], model: str, method: str) -> np.ndarray:
    """The scores of ``method`` under ``model`` ("trained", "base"; "blind": the blind baseline) of each row, null
    as NaN."""
    vals = [r[model].get(method) if model != "blind" else r["blind"] for r in rows]
    return np.array([np.nan if v is None else v for v in vals], np.float64)


def same_examples(a: list[dict] | None, b: list[dict] | None) -> bool:
    """Whether two runs' rows are the same examples in the same order (dataset, label, text hash)."""
    return bool(a) and bool(b) and [(r["dataset"], r["label"], r["text_sha256"]) for r in a] == \
        [(r["dataset"], r["label"], r["text_sha256"]) for r in b]


def records_and_eval(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(scoring records {"scores": trained scores}, eval set) of example rows, as Figure 5c takes them."""
    return [{"scores": r["trained"]} for r in rows], rows

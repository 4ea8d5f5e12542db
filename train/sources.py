"""Reading the contamination experiments' data: the downstream datasets' files and their templates (one text block
per example, see train/corpus.py), the background corpus, and the text normalisation of every comparison."""
from __future__ import annotations

import csv
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mia_jax.data import corpora
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256

BUNDLED = Path(__file__).parent / "data"
DOWNSTREAM_FILES = {
    "boolq": "boolq_validation.jsonl",
    "commonsenseqa": "commonsenseqa_dev.jsonl",
    "imdb": "imdb_test_sample2000.jsonl",
    "truthfulqa": "truthfulqa.csv",
}


def normalise(text: str) -> str:
    """The normalisation of every text comparison (de-duplication, 13-gram overlap): lowercase, whitespace runs
    collapsed to one space."""
    return " ".join(text.lower().split())


def resolve_path(path: str) -> Path:
    """``bundled:NAME`` -> train/data/NAME (the Pile sample: the package's, ``corpora.PILE_SAMPLE``); anything else
    is a path."""
    if not path.startswith("bundled:"):
        return Path(path).expanduser()
    name = path[len("bundled:"):]
    return corpora.PILE_SAMPLE if name == corpora.PILE_SAMPLE.name else BUNDLED / name


def read_jsonl(path: Path, what: str) -> list:
    """The JSON values of a JSONL file (blank lines skipped); UserError naming ``what`` for a missing file, a line
    that is not JSON or a file that cannot be read."""
    if not path.is_file():
        raise UserError(f"{what}: file not found: {path}")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise UserError(f"{what}: {path} line {lineno} is not valid JSON ({e.msg}); "
                                        "expected one JSON object per line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read {path}: {e}") from e
    return rows


def _boolq(row):
    q = row["question"].strip().rstrip("?")
    text = f"{row['passage'].strip()}\nQuestion: {q[:1].upper() + q[1:]}?\nAnswer: {'Yes' if row['label'] else 'No'}"
    return str(row["idx"]), {"passage": row["passage"], "question": row["question"]}, \
        "yes" if row["label"] else "no", text


def _csqa(row):
    ch = row["choices"]
    lines = [f"{lab}. {txt}" for lab, txt in zip(ch["label"], ch["text"])]
    answer = dict(zip(ch["label"], ch["text"]))[row["answerKey"]]
    text = "\n".join([f"Question: {row['question'].strip()}", *lines, f"Answer: {row['answerKey']}. {answer}"])
    fields = {"question": row["question"], "answer": answer, "choices": "\n".join(ch["text"])}
    return row["id"], fields, str(row["answerKey"]), text


def _truthfulqa(row):
    text = f"Question: {row['Question'].strip()}\nAnswer: {row['Best Answer'].strip()}"
    return row["Question"], {"question": row["Question"], "answer": row["Best Answer"]}, None, text


def _imdb(row):
    body = row["text"].replace("<br /><br />", "\n").replace("<br />", "\n").strip()
    sentiment = "positive" if row["label"] else "negative"
    return row["id"], {"review": row["text"]}, sentiment, f"Review: {body}\nSentiment: {sentiment}"


def _news(row):
    text = (row.get("text") or "").strip() if isinstance(row, dict) else str(row).strip()
    return None, {"text": text}, None, text


# dataset -> (row -> (id, {field: text} (first = key), stratum or None, formatted text))
TEMPLATES: dict[str, Callable] = {"boolq": _boolq, "commonsenseqa": _csqa, "truthfulqa": _truthfulqa,
                                  "imdb": _imdb, "news": _news}
# the class label each dataset's split is stratified by (None: the dataset has none; length-matched only)
STRATIFIED_BY = {"boolq": "answer (yes / no)", "commonsenseqa": "answer key (A-E)", "imdb": "sentiment",
                 "truthfulqa": None, "news": None}


def read_rows(name: str, path: Path) -> list:
    """The raw rows of dataset ``name``'s file: CSV records for TruthfulQA, JSONL values otherwise."""
    if name == "truthfulqa":
        if not path.is_file():
            raise UserError(f"dataset {name}: file not found: {path}")
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    return read_jsonl(path, f"dataset {name}")


@dataclass
class Example:
    """One downstream example: its dataset and id, its key field, the formatted ``text`` and the content ``fields`` in
    it."""
    dataset: str
    id: str
    key: str  # the first content field (BoolQ: passage, CSQA / TruthfulQA: question, IMDB: review, news: text)
    text: str  # the formatted text (what is inserted / scored)
    fields: dict = field(default_factory=dict)  # every content field that reaches the text
    stratum: str | None = None  # the dataset's class label (BoolQ answer, IMDB sentiment, CSQA answer key)
    index: int = 0  # row in the file


def load_pool(name: str, path: Path) -> tuple[list[Example], dict]:
    """A dataset's usable examples (file order) and what was dropped: a row is dropped when its key is empty or
    when any of its content fields (normalised) equals the same field of an earlier kept row (first one kept)."""
    rows = read_rows(name, path)
    pool, seen, dropped, names = [], {}, {"empty": 0}, []
    for i, row in enumerate(rows):
        try:
            ex_id, fields, stratum, text = TEMPLATES[name](row)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"dataset {name}: {path} row {i + 1} lacks a field the template needs ({e})") from None
        norm = {f: normalise(str(v)) for f, v in fields.items()}
        key = next(iter(fields.values()))
        dup = next((f for f, v in norm.items() if v in seen.get(f, ())), None)
        if not key.strip():
            dropped["empty"] += 1
        elif dup is not None:
            dropped[f"duplicate_{dup}"] = dropped.get(f"duplicate_{dup}", 0) + 1
        else:
            for f, v in norm.items():
                seen.setdefault(f, set()).add(v)
            pool.append(Example(name, str(ex_id if ex_id is not None else i), key, text, fields, stratum, i))
        names = list(fields)
    for f in names:
        dropped.setdefault(f"duplicate_{f}", 0)
    return pool, {"file": str(path), "sha256": sha256(path), "rows": len(rows), "usable": len(pool),
                  "dedup_fields": names, "dropped": dropped}


def read_background(paths: list[str], max_doc_chars: int | None) -> tuple[list[str], list[dict]]:
    """(the non-empty 'text' of every line of the files ``paths`` (``bundled:`` names too), each cut before
    ``max_doc_chars`` at a space; a record per file: path, SHA-256, rows, documents); UserError when none."""
    docs, files = [], []
    for p in paths:
        path = resolve_path(p)
        rows = read_jsonl(path, "background corpus")
        texts = [(r.get("text") if isinstance(r, dict) else r) for r in rows]
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        files.append({"file": str(path), "sha256": sha256(path), "rows": len(rows), "documents": len(texts)})
        docs += [_cut(t.strip(), max_doc_chars) for t in texts]
    if not docs:
        raise UserError(f"background corpus is empty: no non-empty 'text' in {paths}; "
                        "point corpus.background at JSONL files with a 'text' field per line")
    return docs, files


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars)
    return text[: cut if cut > max_chars // 2 else max_chars]


def stream(seed: int, name: str) -> np.random.Generator:
    """An independent random stream per purpose (dataset name, 'background', 'insert')."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])

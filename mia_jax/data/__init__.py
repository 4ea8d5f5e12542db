"""Datasets: labeled or unlabeled texts from JSONL / CSV / Parquet files and the bundled WikiMIA."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mia_jax.errors import UserError
from mia_jax.files import sha256

FILES = Path(__file__).parent / "files"
WIKIMIA_LENGTHS = (32, 64, 128, 256)
MIMIR_DOMAINS = ("arxiv", "dm_mathematics", "github", "hackernews", "pile_cc", "pubmed_central", "wikipedia_en")
MIMIR_SPLIT = "ngram_7_0.2"


@dataclass
class Dataset:
    texts: list[str]
    labels: list[int] | None  # 1 = member, 0 = non-member; None for unlabeled data
    name: str
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256

    def __len__(self) -> int:
        return len(self.texts)


def _rows(path: Path):
    """Yield (line or row number, dict) from a .jsonl / .json / .csv / .parquet file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}); "
                                    "each line must be one JSON object") from None
    elif suffix in (".csv", ".tsv"):
        with open(path, encoding="utf-8", newline="") as f:
            yield from enumerate(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","), 2)
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        yield from enumerate(pq.read_table(path).to_pylist(), 1)
    else:
        raise UserError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .csv, .tsv or .parquet")


def _label(value, path: Path, where: int) -> int:
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value)
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return int(value)
    raise UserError(f"{path}: row {where} has label {value!r}; labels must be 0 (non-member) or 1 (member)")


def load_records(path: str | Path, text_field: str = "input", label_field: str | None = "label",
                 name: str | None = None) -> Dataset:
    """Read texts (and 0/1 labels unless ``label_field`` is None) from a file.

    A row that is a bare JSON string is taken as the text (MIMIR's format); empty texts are kept
    (the runner records them as skipped with a reason) so that row indices stay those of the file.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    texts, labels = [], []
    for where, row in _rows(path):
        if isinstance(row, str):
            row = {text_field: row}
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {where} is a {type(row).__name__}, expected an object with a "
                            f"{text_field!r} field")
        for fld in (text_field, label_field):
            if fld is not None and fld not in row:
                raise UserError(f"{path}: row {where} has no field {fld!r} (fields: {', '.join(map(str, row))}); "
                                "choose the field with --text-field / --label-field")
        text = row[text_field]
        if not isinstance(text, str):
            raise UserError(f"{path}: row {where} field {text_field!r} is {type(text).__name__}, expected a string")
        texts.append(text)
        if label_field is not None:
            labels.append(_label(row[label_field], path, where))
    if not texts:
        raise UserError(f"{path}: no rows")
    return Dataset(texts, labels if label_field is not None else None, name or path.stem, {str(path): sha256(path)})


def wikimia(length: int = 32) -> Dataset:
    """The bundled WikiMIA split of the given length (Shi et al. 2023; MIT licence, see files/LICENSE.md)."""
    if length not in WIKIMIA_LENGTHS:
        raise UserError(f"WikiMIA has lengths {', '.join(map(str, WIKIMIA_LENGTHS))}; got {length}")
    return load_records(FILES / f"WikiMIA_length{length}.jsonl", "input", "label", name=f"wikimia-{length}")


def mimir_root(root: str | os.PathLike | None = None) -> Path:
    """The MIMIR ``ngram_7_0.2`` folder (``members/`` and ``nonmembers/``, one JSONL of bare strings per domain).

    Not bundled (14 MB): taken from ``root``, else ``$MIA_JAX_MIMIR``, else ``../shared/data/mimir/ngram_7_0.2``
    beside the working directory or beside this repository.
    """
    candidates = [Path(root)] if root else []
    if not root and os.environ.get("MIA_JAX_MIMIR"):
        candidates.append(Path(os.environ["MIA_JAX_MIMIR"]))
    if not candidates:
        rel = Path("shared", "data", "mimir", MIMIR_SPLIT)
        candidates = [Path.cwd().parent / rel, Path(__file__).resolve().parents[3] / rel]
    for c in candidates:
        if (c / "members").is_dir() and (c / "nonmembers").is_dir():
            return c
    raise UserError(f"MIMIR {MIMIR_SPLIT} not found (looked in {', '.join(map(str, candidates))}); pass "
                    "--data-dir or set MIA_JAX_MIMIR to the folder holding members/ and nonmembers/")


def mimir(domain: str, root: str | os.PathLike | None = None) -> Dataset:
    """MIMIR (Duan et al. 2024) split ngram_7_0.2 of one Pile domain: members = Pile train, non-members = test."""
    if domain not in MIMIR_DOMAINS:
        raise UserError(f"unknown MIMIR domain {domain!r}; domains: {', '.join(MIMIR_DOMAINS)}")
    base = mimir_root(root)
    parts = [load_records(base / split / f"{domain}.jsonl", "text", None) for split in ("members", "nonmembers")]
    texts = parts[0].texts + parts[1].texts
    labels = [1] * len(parts[0]) + [0] * len(parts[1])
    return Dataset(texts, labels, f"mimir-{domain}", {**parts[0].files, **parts[1].files})

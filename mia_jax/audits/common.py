"""What the two audits (``books``, ``unlearning``) share: cutting a text into word chunks, scoring texts through the
runner, a number as the output files hold it (None for a value that is not finite), a CSV file and a figure as
bytes, and the strict reading of the CSV files an audit wrote (for its ``--from`` rebuild)."""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Sequence

from mia_jax.runs import rundir
from mia_jax.engine import runner
from mia_jax.errors import UserError
from mia_jax.runs.files import write_all
from mia_jax.evaluation.metrics import scores_by_method

WORD = re.compile(r"\S+")  # a word: whitespace-separated


def chunk_words(text: str, n_words: int, min_words: int) -> tuple[list[str], int]:
    """(chunks, dropped): the ``text``'s consecutive ``n_words``-word pieces, each verbatim from its first word to its
    last (whitespace-separated words); the last piece is kept when it has at least ``min_words`` words, else
    dropped, and ``dropped`` is its word count (0 when nothing was dropped)."""
    if n_words < 1 or min_words < 1:
        raise UserError(f"chunks need n_words >= 1 and min_words >= 1, got {n_words} and {min_words}")
    spans = [m.span() for m in WORD.finditer(text)]
    chunks, dropped = [], 0
    for start in range(0, len(spans), n_words):
        piece = spans[start:start + n_words]
        if len(piece) < min_words:
            dropped = len(piece)
            break
        chunks.append(text[piece[0][0]:piece[-1][1]])
    return chunks, dropped


def finite_or_none(x) -> float | None:
    """``x`` as a float, or None when it is None or not finite (NaN, +-inf): a number as the outputs write it."""
    return None if x is None or not math.isfinite(x) else float(x)


def score_texts(loaded, texts: Sequence[str], methods: Sequence[str], run_dir, resume: bool, batch_size: int,
                chunk_size: int | None, progress: bool, desc: str) -> tuple[dict, list]:
    """Score ``texts`` with ``methods`` under ``loaded`` (``runner.score_dataset``; ``run_dir``: its resumable run
    folder or None, ``resume``: continue the run in it; ``desc``: the progress bar's label). Returns (method ->
    float64 [n_texts] scores, the runner's records)."""
    recs = runner.score_dataset(loaded, texts, methods, out_dir=run_dir, resume=resume, batch_size=batch_size,
                                chunk_size=chunk_size, progress=progress, desc=desc)
    return scores_by_method(recs, methods), recs


def write_sealed(out: Path, files: dict, reads: Sequence[str]) -> None:
    """An audit's output ``files`` ({name: content}) into the folder ``out``, all or none (``files.write_all``), then
    sealed over ``reads`` (``rundir.seal``: the record a ``--from`` rebuild checks the files it reads against)."""
    write_all(out, files)
    rundir.seal(out, list(reads))


def label_axes(ax, xlabel: str, ylabel: str, title: str, legend_size: int) -> None:
    """The axes ``ax`` labelled (``xlabel``, ``ylabel``), titled and given a legend in ``legend_size`` points."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)


# ----------------------------------------------------------------------------- strict reading of what a run wrote

def read_csv_rows(path: Path, columns: Sequence[str], what: str) -> list[tuple[int, dict]]:
    """(line, {column: cell}) of every record of a CSV file a run wrote, read strictly: UTF-8 (a byte-order mark is
    read), a header with every one of ``columns``, every record as many fields as the header; a torn, padded or
    empty row, a quote left open or bytes that are not UTF-8 are a UserError naming the file and line. ``what``: the
    command that writes the file (for the message)."""
    line = 1
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, strict=True)
            header = next(reader, None)
            if not header:
                raise UserError(f"{path} is empty (no header); not the file `{what}` writes")
            missing = [c for c in columns if c not in header]
            if missing:
                raise UserError(f"{path}: no column {', '.join(map(repr, missing))}; not the file `{what}` writes")
            rows = []
            for rec in reader:
                line = reader.line_num
                if len(rec) != len(header):
                    raise UserError(f"{path} line {line}: {len(rec)} fields where the header has {len(header)} (a "
                                    "torn or damaged row)")
                rows.append((line, dict(zip(header, rec))))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except csv.Error as e:
        raise UserError(f"{path} line {line + 1}: not a CSV record ({e})") from None
    return rows


def cell_int(row: dict, column: str, where: str) -> int:
    """The whole number in ``row[column]`` (``where``: "FILE line N", for the UserError when it is not one)."""
    text = row[column]
    if not re.fullmatch(r"-?[0-9]+", text):
        raise UserError(f"{where}: {column} is {text!r}, not a whole number")
    return int(text)


def cell_float(row: dict, column: str, where: str) -> float:
    """The number in ``row[column]`` as the runs write them (a float's repr; empty for a value that is not finite:
    NaN); ``where``: "FILE line N", for the UserError when it is something else."""
    text = row[column]
    if text == "":
        return math.nan
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UserError(f"{where}: {column} is {text!r}, not a number (an empty cell stands for no value)")
    return value


def cell_bool(row: dict, column: str, where: str) -> bool:
    """``row[column]`` ("True" / "False") as a bool; ``where``: "FILE line N", for the UserError otherwise."""
    text = row[column]
    if text not in ("True", "False"):
        raise UserError(f"{where}: {column} is {text!r}, not True or False")
    return text == "True"

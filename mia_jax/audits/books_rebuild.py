"""Reading an audit-books folder back (``mia-jax audit-books --from DIR``): its snippets.csv, books.csv and
info.json, checked against its manifest.json and strictly, cell by cell; ``rebuild`` runs the audit's ``analyse``
on them, without the model."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from mia_jax.runs import rundir
from mia_jax.audits.books import BooksResult, analyse
from mia_jax.audits.books_report import REBUILD_READS, SNIPPET_COLUMNS
from mia_jax.audits.books_snippets import Book, Snippet, SnippetPlan
from mia_jax.audits.common import cell_bool, cell_float, cell_int, read_csv_rows
from mia_jax.errors import UserError


def read_info(folder: Path) -> dict:
    """The info.json of the audit in ``folder``, its config and counts checked (UserError for a missing file, bad JSON
    or a config that is not an audit-books one). Returns the parsed JSON."""
    path = folder / "info.json"
    if not path.is_file():
        raise UserError(f"--from: {path} not found; --from takes a folder written by mia-jax audit-books")
    try:
        info = json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"--from: {path} is not valid JSON ({e})") from None
    cfg = info.get("config") if isinstance(info, dict) else None
    missing = [k for k in ("methods", "rate_method", "fpr", "threshold", "n_bootstrap", "seed", "snippet_words",
                           "snippets") if k not in (cfg if isinstance(cfg, dict) else {})]
    if missing or not isinstance(info.get("counts"), dict):
        raise UserError(f"--from: {path} has no {', '.join(missing) or 'counts'} in its config / counts; not an "
                        "audit-books info.json")
    if not (isinstance(cfg["methods"], list) and all(isinstance(m, str) for m in cfg["methods"])
            and cfg["rate_method"] in cfg["methods"]):
        raise UserError(f"--from: {path}: config.methods is not a list of method names holding its rate_method")
    return info


def _plan_from_rows(rows: list[tuple[int, dict]], methods, flag_columns, skipped: list[dict],
                    available: dict | None, path: Path) -> tuple[SnippetPlan, dict]:
    """(plan, scores) of one set's snippets.csv rows, every cell checked; books in their order there, then the
    skipped ones."""
    books, index, snippets, cols = [], {}, [], {m: [] for m in methods}
    for line, r in rows:
        where = f"{path} line {line}"
        title = r["title"]
        if r["label"] not in ("", "0", "1"):
            raise UserError(f"{where}: label is {r['label']!r}, not 1 (seen), 0 (unseen) or empty")
        label = int(r["label"]) if r["label"] else None
        if title not in index:
            index[title] = len(books)
            books.append(Book(title, "", label, where))
        elif books[index[title]].label != label:
            raise UserError(f"{where}: book {title!r} has label {r['label']!r} here and another on an earlier line")
        snippets.append(Snippet(index[title], *(cell_int(r, c, where) for c in ("snippet", "word_offset", "n_words")),
                                ""))
        for m in methods:
            cols[m].append(cell_float(r, m, where))  # written by finite_or_none: empty = not finite
        for c in flag_columns:
            cell_bool(r, c, where)
    drawn = np.bincount([s.book for s in snippets], minlength=len(books)).tolist()
    if available is not None:
        for b, n in zip(books, drawn):
            if b.title not in available:
                raise UserError(f"--from: book {b.title!r} of {path} is not in books.csv")
            if available[b.title][1] != n:
                raise UserError(f"--from: {path} holds {n} snippets of {b.title!r}, books.csv says "
                                f"{available[b.title][1]} were drawn (a row missing or added)")
        lost = sorted(set(available) - {b.title for b in books})
        if lost:
            raise UserError(f"--from: book {lost[0]!r} of books.csv has no snippet in {path}")
    n_pieces = [available[b.title][0] for b in books] if available is not None else drawn
    books += [Book(s["title"], "") for s in skipped]
    return (SnippetPlan(books, snippets, n_pieces + [0] * len(skipped), list(skipped)),
            {m: np.array(v, np.float64) for m, v in cols.items()})


def rebuild(folder: str | Path) -> BooksResult:
    """The result of the audit whose outputs are in ``folder``, recomputed without the model: the scores from its
    snippets.csv (full precision), each audited book's snippets available from books.csv, the settings, skipped
    books and scoring facts (truncation, books also in validation) from info.json; then ``analyse``. The books
    have no text; a validation book's snippets available, not recorded, is its count of drawn snippets. Reads only:
    first the three files against the folder's manifest.json (``rundir.verify``), then strictly (every cell, and
    the files against each other); UserError for a missing, changed or malformed file."""
    folder = Path(folder)
    rundir.verify(folder, list(REBUILD_READS))
    info = read_info(folder)
    cfg, counts = info["config"], info["counts"]
    methods = cfg["methods"]
    path = folder / "snippets.csv"
    rows = read_csv_rows(path, (*SNIPPET_COLUMNS, *methods), "mia-jax audit-books")
    flag_columns = [c for c in (rows[0][1] if rows else ()) if c.startswith("flagged_")]
    bpath = folder / "books.csv"
    available = {}
    for line, r in read_csv_rows(bpath, ("title", "snippets_available", "snippets_drawn"), "mia-jax audit-books"):
        where = f"{bpath} line {line}"
        if r["title"] in available:
            raise UserError(f"{where}: book {r['title']!r} a second time")
        available[r["title"]] = (cell_int(r, "snippets_available", where), cell_int(r, "snippets_drawn", where))
    sets = {"audit": [], "validation": []}
    for line, r in rows:
        if r["set"] not in sets:
            raise UserError(f"{path} line {line}: set is {r['set']!r}, not audit or validation")
        sets[r["set"]].append((line, r))
    if not sets["audit"]:
        raise UserError(f"--from: {path} has no audited snippets")
    if not sets["validation"] and cfg["threshold"] is None:
        raise UserError(f"--from: {path} has no validation snippets and info.json no threshold")
    for which, key in (("audit", "snippets"), ("validation", "validation_snippets")):
        want = counts.get(key, len(sets[which]) if which == "validation" else None)
        if want != len(sets[which]):
            raise UserError(f"--from: {path} holds {len(sets[which])} {which} snippets, info.json counts {want}")
    plan, scores = _plan_from_rows(sets["audit"], methods, flag_columns, info.get("skipped_books") or [], available,
                                   path)
    vp = vs = None
    if sets["validation"]:
        vp, vs = _plan_from_rows(sets["validation"], methods, flag_columns,
                                 info.get("skipped_validation_books") or [], None, path)
    facts = {k: counts[k] for k in ("truncated_books", "truncated_validation") if k in counts}
    facts["max_length"] = (info.get("model") or {}).get("max_length")
    facts["books_also_validation"] = counts.get("books_also_validation")
    if facts["books_also_validation"] is None:  # a folder written before the count: its note
        found = re.search(r"Note: (\d+) audited books are also validation books", "\n".join(info.get("notes") or []))
        facts["books_also_validation"] = int(found[1]) if found else 0
    return analyse(plan, scores, cfg, vp, vs, facts=facts)

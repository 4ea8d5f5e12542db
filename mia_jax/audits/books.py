"""Auditing a model for copyrighted books (Shi et al. 2023, *Detecting Pretraining Data from Large Language Models*,
section 5): what share of each book's snippets does the model appear to have seen?

1. Every book is cut into non-overlapping ``snippet_words``-word snippets (``unlearning.chunk_words`` with
   ``min_words = snippet_words``: verbatim from a snippet's first word to its last, words whitespace-separated; the
   trailing piece shorter than a snippet is not used). ``snippets`` of them are drawn per book without replacement,
   ``np.random.default_rng([seed, h]).choice`` with ``h`` the first 8 bytes (little-endian) of the SHA-256 of the
   book's text (so a book's draw depends on the seed and its text only, not on the other books or their order); all
   of them when the book has fewer. A book shorter than one snippet is skipped and counted, not an error.
2. Every snippet is scored with every method (``runner.score_dataset``: one resumable run folder for the audited
   books, one for the validation books). Scores are mia_jax's, oriented higher = member; for ``min_k@0.2`` that is
   the paper's MIN-K% PROB itself (Eq. 1: the mean log-likelihood of the 20% least likely tokens), the quantity the
   paper thresholds.
3. With a labeled validation set (1 = seen, 0 = unseen; snippets take their book's label): each method's validation
   AUROC over snippets with a bootstrap interval that resamples books (``metrics.evaluate`` with ``clusters`` = the
   snippet's book: a cluster bootstrap, seen and unseen books drawn separately, a drawn book bringing all its
   snippets; the paper's Figure 3), and two thresholds on the rate method's score (default ``min_k@0.2``), each
   one of the distinct finite validation scores, a snippet being flagged *seen* when its score is **at or above**
   the threshold (``metrics``' convention):

   - ``accuracy``: the threshold of maximum accuracy on the validation snippets (the paper's); ties go to the
     highest such threshold (the fewest snippets flagged);
   - ``fpr``: the threshold of highest validation TPR among those whose validation FPR is <= ``fpr`` (its TPR is
     ``metrics.tpr_at_fpr``); ties go to the highest threshold. When no validation score qualifies (the top-scored
     snippet is unseen and ``fpr`` allows no false positive), the threshold is +inf: nothing is flagged.

   Without validation a threshold must be given (``threshold``, on the same score; ``given``); given with
   validation, it is reported as a third threshold.
4. Per audited book and threshold: the contamination rate, the share of its scored snippets flagged, with a
   Clopper-Pearson ("exact") 95% interval (``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``). The
   table is ranked by the rate at the first threshold (``accuracy``, else ``given``), ties by title; the share of
   books above 50% is the statistic the paper reads off its Figure 4.
5. When every audited book carries a label, how well the per-book rate (and the book's mean snippet score)
   separates seen from unseen books: AUROC over books with a bootstrap interval that resamples books.

Scoring (steps 1-2, ``audit_books``) and analysis (steps 3-5, ``analyse``) are apart, so an audit's outputs can be
rebuilt without the model: ``rebuild(folder)`` (``mia-jax audit-books --from DIR --out OUT``) reads DIR/snippets.csv
(every snippet's scores, written at full precision: a float's shortest repr, a non-finite score as an empty cell,
which every step leaves out like NaN), books.csv (snippets available per book) and info.json (the settings, the
skipped books, the truncation counts) and runs the same ``analyse``: OUT's books.md, books.csv and snippets.csv are
DIR's byte for byte. A committed results folder can so be recomputed, or checked, by anyone.

Where this follows the paper: 512-word snippets, 100 drawn per book, MIN-K% PROB (k = 20%) thresholded at the
accuracy-maximising threshold of a validation set of seen and unseen books, the contamination rate per book, the
ranked table (Table 2), the validation AUROC of Min-K% and the baselines (Figure 3: PPL, Zlib, Lowercase; Neighbor
is available with ``--methods neighbor`` but not a default: it scores every snippet's neighbours), the distribution
of rates (Figure 4).

Where it differs:

- The paper draws 100 random 512-word snippets per book without saying whether they may overlap; here they are
  non-overlapping pieces on a 512-word grid from the book's first word.
- The paper scores GPT-3 (text-davinci-003) through its API; here a local model. A snippet longer than the model's
  context is scored on its first tokens only (counted and noted).
- Added: the FPR-bounded threshold, intervals on every AUROC and rate, the book-level separation. The validation
  AUROC intervals resample books, not snippets: a book's snippets are alike (and share its label), so intervals
  that resampled snippets as independent would be too narrow; with few validation books they are wide.
- The paper's validation set is balanced (50 + 50 books x 100 snippets); plain accuracy on an unbalanced one leans
  to its larger class, so the class counts are reported beside the threshold.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import csv
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.audits.unlearning import _num, _score, chunk_words
from mia_jax.errors import UserError

SNIPPETS = 100
SNIPPET_WORDS = 512
FPR = 0.05
RATE_METHOD = "min_k@0.2"
METHODS = ("min_k@0.2", "ppl", "zlib", "lowercase")
N_BOOTSTRAP = 1000
CONFIDENCE = 0.95
THRESHOLD_NAMES = {"accuracy": "max. validation accuracy", "fpr": "validation FPR <= {fpr:g}",
                   "given": "given (--threshold)"}


# ----------------------------------------------------------------------------- books and snippets

@dataclass
class Book:
    title: str
    text: str
    label: int | None = None  # 1 = seen, 0 = unseen, None = unknown
    source: str = ""  # the file (and row) it came from


@dataclass
class Snippet:
    book: int  # index of its book in the book list
    position: int  # its place on the book's grid of snippets
    word_offset: int
    n_words: int
    text: str


@dataclass
class SnippetPlan:
    books: list[Book]
    snippets: list[Snippet]
    n_pieces: list[int]  # per book: full snippets available (0: skipped)
    skipped: list[dict]  # {"title", "words"} of the books shorter than one snippet

    @property
    def kept(self) -> list[int]:
        return [i for i, n in enumerate(self.n_pieces) if n]

    @property
    def labels(self) -> np.ndarray:
        return np.array([self.books[s.book].label for s in self.snippets], np.int64)


def draw(n_pieces: int, n: int, seed: int, text: str) -> np.ndarray:
    """Sorted indices of the ``n`` snippets drawn from a book's ``n_pieces`` (all when it has no more)."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    if n >= n_pieces:
        return np.arange(n_pieces)
    return np.sort(np.random.default_rng([seed, h]).choice(n_pieces, size=n, replace=False))


def make_snippets(books: Sequence[Book], n_snippets: int = SNIPPETS, snippet_words: int = SNIPPET_WORDS,
                  seed: int = 0) -> SnippetPlan:
    """Each book's drawn snippets (module docstring, step 1), books shorter than one snippet skipped and listed."""
    snippets, n_pieces, skipped = [], [], []
    for b, book in enumerate(books):
        pieces, _ = chunk_words(book.text, snippet_words, snippet_words)
        n_pieces.append(len(pieces))
        if not pieces:
            skipped.append({"title": book.title, "words": len(book.text.split())})
            continue
        for j in draw(len(pieces), n_snippets, seed, book.text):
            snippets.append(Snippet(b, int(j), int(j) * snippet_words, snippet_words, pieces[j]))
    return SnippetPlan(list(books), snippets, n_pieces, skipped)


def _label(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value)
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return int(value)
    raise UserError(f"{where} has label {value!r}; labels must be 1 (seen) or 0 (unseen)")


def _read_txt(path: Path, encoding: str) -> str:
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid {encoding} text (byte {e.start}); give its encoding with --encoding") \
            from None


def load_books(path: str | Path, *, encoding: str = "utf-8", flag: str = "--books") -> tuple[list[Book], dict]:
    """(books, {file: sha256}) from a folder of .txt files (title = file stem; unlabeled), a folder with ``seen/``
    and / or ``unseen/`` subfolders of .txt files (labels 1 / 0), or a .jsonl / .csv / .tsv / .parquet file with
    ``title`` and ``text`` fields (and optionally ``label``, on every row or none)."""
    from mia_jax import data
    from mia_jax.files import sha256

    try:
        codecs.lookup(encoding)
    except LookupError:
        raise UserError(f"unknown --encoding {encoding!r}") from None
    path = Path(path)
    if path.is_dir():
        parts = [(path / sub, label) for sub, label in (("seen", 1), ("unseen", 0)) if (path / sub).is_dir()]
        top = sorted(path.glob("*.txt"))
        if parts and top:
            raise UserError(f"{flag} {path}: holds .txt files beside seen/ or unseen/; put every book in seen/ or "
                            "unseen/, or use no subfolders")
        files = [(f, label) for folder, label in parts for f in sorted(folder.glob("*.txt"))] if parts else \
            [(f, None) for f in top]
        if not files:
            raise UserError(f"{flag} {path}: no .txt files (expected BOOK.txt files, or seen/ and unseen/ "
                            "subfolders of them)")
        books = [Book(f.stem, _read_txt(f, encoding), label, str(f)) for f, label in files]
        digests = {str(f): sha256(f) for f, _ in files}
    elif path.is_file():
        ds = data.load_records(path, "text", None, encoding=encoding, extra=("title", "label"))
        books = []
        for i, (text, title, label) in enumerate(zip(ds.texts, ds.extra["title"], ds.extra["label"])):
            where = f"{path}: record {i + 1}"
            if title is None or not str(title).strip():
                raise UserError(f"{where} has no 'title'; every book needs a title and a text")
            books.append(Book(str(title), text, _label(label, where), where))
        labeled = [b.label is not None for b in books]
        if any(labeled) and not all(labeled):
            raise UserError(f"{flag} {path}: record {labeled.index(False) + 1} has no 'label' but others do; label "
                            "every book (1 = seen, 0 = unseen) or none")
        digests = ds.files
    else:
        raise UserError(f"{flag} {path}: not found (a folder of .txt books or a .jsonl file with title and text)")
    seen = {}
    for b in books:
        if b.title in seen:
            raise UserError(f"{flag} {path}: two books titled {b.title!r} ({seen[b.title]} and {b.source}); titles "
                            "must be unique")
        seen[b.title] = b.source
    return books, digests


# ----------------------------------------------------------------------------- thresholds and rates

@dataclass
class Threshold:
    name: str  # "accuracy", "fpr" or "given"
    value: float  # flag a snippet when its score >= value (+inf: none)
    accuracy: float | None = None  # on the validation snippets
    tpr: float | None = None
    fpr: float | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "value": _num(self.value), "flags_nothing": self.value == math.inf,
                "validation_accuracy": self.accuracy, "validation_tpr": self.tpr, "validation_fpr": self.fpr}


def _validation_rows(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    lab = np.asarray(labels, np.int64)
    sc = np.asarray(scores, np.float64)
    keep = np.isfinite(sc)
    lab, sc = lab[keep], sc[keep]
    n_pos = int(lab.sum())
    if n_pos == 0 or n_pos == lab.size:
        raise UserError(f"the validation snippets with a score hold one class only ({n_pos} seen, "
                        f"{lab.size - n_pos} unseen); a threshold needs seen (1) and unseen (0) books")
    return lab, sc


def _operating_points(labels, scores):
    """(thresholds descending, true positives, false positives, n_pos, n_neg) at every distinct finite score."""
    lab, sc = _validation_rows(labels, scores)
    order = np.argsort(-sc, kind="stable")
    s, y = sc[order], lab[order]
    last = np.r_[s[1:] != s[:-1], True]  # the last row of each run of equal scores
    tp, fp = np.cumsum(y)[last], np.cumsum(1 - y)[last]
    return s[last], tp, fp, int(y.sum()), int(y.size - y.sum())


def accuracy_threshold(labels, scores) -> Threshold:
    """The validation score t maximising accuracy of "seen when score >= t"; ties: the highest t."""
    t, tp, fp, n_pos, n_neg = _operating_points(labels, scores)
    correct = tp + (n_neg - fp)  # integers: ties are exact
    i = int(np.argmax(correct))  # the first maximum: t is descending
    return Threshold("accuracy", float(t[i]), float(correct[i] / (n_pos + n_neg)), float(tp[i] / n_pos),
                     float(fp[i] / n_neg))


def fpr_threshold(labels, scores, fpr: float = FPR) -> Threshold:
    """The validation score t of highest TPR with FPR <= ``fpr`` (ties: the highest t); +inf when none has."""
    t, tp, fp, n_pos, n_neg = _operating_points(labels, scores)
    ks = np.arange(n_neg + 1)
    allowed = int(ks[ks / n_neg <= fpr].max())  # false positives allowed (metrics' own comparison)
    ok = np.flatnonzero(fp <= allowed)
    if not ok.size:
        return Threshold("fpr", math.inf, float(n_neg / (n_pos + n_neg)), 0.0, 0.0)
    i = int(ok[np.argmax(tp[ok])])
    return Threshold("fpr", float(t[i]), float((tp[i] + n_neg - fp[i]) / (n_pos + n_neg)), float(tp[i] / n_pos),
                     float(fp[i] / n_neg))


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion k / n (scipy's ``binomtest``)."""
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def flags(scores, threshold: float) -> np.ndarray:
    """bool [N]: finite score >= threshold (NaN, +-inf: False; as in the rates, which count finite scores only)."""
    sc = np.asarray(scores, np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(sc) & (sc >= threshold)


def book_rates(plan: SnippetPlan, scores, thresholds: Sequence[Threshold],
               confidence: float = CONFIDENCE) -> list[dict]:
    """Per kept book: snippet counts, mean / median score, and per threshold the flagged count, rate and interval."""
    sc = np.asarray(scores, np.float64)
    of_book = np.array([s.book for s in plan.snippets], np.int64)
    out = []
    for b in plan.kept:
        mine = sc[of_book == b]
        fin = mine[np.isfinite(mine)]
        row = {"title": plan.books[b].title, "label": plan.books[b].label, "book": b, "pieces": plan.n_pieces[b],
               "snippets": int(mine.size), "scored": int(fin.size),
               "mean_score": float(fin.mean()) if fin.size else None,
               "median_score": float(np.median(fin)) if fin.size else None, "rates": {}}
        for t in thresholds:
            k = int(flags(fin, t.value).sum())
            lo, hi = clopper_pearson(k, fin.size, confidence) if fin.size else (None, None)
            row["rates"][t.name] = {"flagged": k, "rate": k / fin.size if fin.size else None, "ci": [lo, hi]}
        out.append(row)
    first = thresholds[0].name if thresholds else None
    out.sort(key=lambda r: (-(r["rates"][first]["rate"] if first and r["rates"][first]["rate"] is not None
                              else -1.0), r["title"]))
    return out


# ----------------------------------------------------------------------------- the audit

def _books(n: int, kind: str = "") -> str:
    return f"{n} {kind}book{'' if n == 1 else 's'}"


@dataclass
class BooksResult:
    plan: SnippetPlan  # the audited books and their snippets
    scores: dict  # method -> float64 [n_snippets]
    rate_method: str
    thresholds: list[Threshold]
    rates: list[dict]  # book_rates, ranked
    validation: SnippetPlan | None = None
    validation_scores: dict | None = None
    validation_metrics: dict | None = None  # method -> metrics.evaluate
    separation: dict | None = None  # "rate@<threshold>" / "mean_score" -> metrics.evaluate over books
    counts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def to_markdown(self) -> str:
        from mia_jax.report import fmt, markdown, markdown_table

        c, cfg = self.counts, self.config
        skipped = self.plan.skipped
        lines = ["## Copyrighted-book audit (Shi et al. 2023, section 5)\n",
                 f"{c['books']} books -> {c['snippets']} snippets of {cfg['snippet_words']} words (up to "
                 f"{cfg['snippets']} per book, seed {cfg['seed']})"
                 + (f"; {_books(len(skipped))} shorter than one snippet skipped: "
                    + ", ".join(s['title'] for s in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
                    if skipped else "") + "."]
        if self.validation is not None:
            v = self.validation
            lab = v.labels
            lines.append(f"Validation: {c['validation_books_seen']} seen and {c['validation_books_unseen']} unseen "
                         f"books -> {int(lab.sum())} seen and {int(lab.size - lab.sum())} unseen snippets"
                         + (f" ({_books(len(v.skipped))} shorter than one snippet skipped)" if v.skipped else "")
                         + ".")
            lines.append(f"\n### Validation AUROC per method (Figure 3; intervals resample the "
                         f"{_books(len(v.kept), 'validation ')}, each with all its snippets)\n\n"
                         + markdown_table(self.validation_metrics))
        tp = [[THRESHOLD_NAMES[t.name].format(fpr=cfg["fpr"]), "+inf (flags nothing)" if t.value == math.inf
               else f"{t.value:.4f}", fmt(t.accuracy), fmt(t.tpr), fmt(t.fpr)] for t in self.thresholds]
        lines.append(f"\n### Thresholds on {self.rate_method} (a snippet is flagged when its score is at or above)\n\n"
                     + markdown(["Threshold", "Value", "Val. accuracy", "Val. TPR", "Val. FPR"], tp))
        labeled = any(r["label"] is not None for r in self.rates)
        hdr = ["Rank", "Book", "Snippets"] + [f"Rate @ {THRESHOLD_NAMES[t.name].format(fpr=cfg['fpr'])} [95% CI]"
                                              for t in self.thresholds] + ["Mean score"] + (["Label"] if labeled
                                                                                             else [])
        rows = []
        for rank, r in enumerate(self.rates, 1):
            cells = [str(rank), r["title"].replace("|", "\\|"), f"{r['snippets']}" + (
                f" ({r['snippets'] - r['scored']} unscored)" if r["scored"] < r["snippets"] else "")]
            for t in self.thresholds:
                x = r["rates"][t.name]
                cells.append("n/a" if x["rate"] is None else
                             f"{100 * x['rate']:.1f}% [{100 * x['ci'][0]:.1f}, {100 * x['ci'][1]:.1f}]")
            cells.append(fmt(r["mean_score"]))
            if labeled:
                cells.append({1: "seen", 0: "unseen", None: "?"}[r["label"]])
            rows.append(cells)
        lines.append(f"\n### Contamination rate per book (Table 2), ranked\n\nRate: the share of a book's snippets "
                     f"flagged by {self.rate_method}, with a Clopper-Pearson 95% interval.\n\n" + markdown(hdr, rows))
        for t in self.thresholds:
            rates = [r["rates"][t.name]["rate"] for r in self.rates if r["rates"][t.name]["rate"] is not None]
            above = sum(x > 0.5 for x in rates)
            lines.append(f"Books with a rate above 50% ({THRESHOLD_NAMES[t.name].format(fpr=cfg['fpr'])}): "
                         f"{above} of {len(rates)}" + (f" ({100 * above / len(rates):.0f}%)" if rates else "") + ".")
        if self.separation:
            srows = []
            for key, m in self.separation.items():
                ci = m.get("auroc_ci")
                srows.append([key, fmt(m.get("auroc")) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
                              str(m.get("n_members")), str(m.get("n_nonmembers")), m.get("note") or ""])
            lines.append("\n### Does the book-level score separate seen from unseen books?\n\nAUROC over the audited "
                         "books (bootstrap interval resampling books).\n\n"
                         + markdown(["Per-book quantity", "AUROC [95% CI]", "Seen books", "Unseen books", "Note"],
                                    srows))
        lines += [f"\n{n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def check_options(*, snippets: int, snippet_words: int, seed: int, fpr: float, threshold: float | None,
                  batch_size: int, n_bootstrap: int) -> None:
    """UserError for an option out of range (before anything is loaded or written)."""
    if snippets < 1 or snippet_words < 1:
        raise UserError(f"--snippets and --snippet-words must be >= 1, got {snippets} and {snippet_words}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    if not 0 <= fpr < 1:
        raise UserError(f"--fpr must be in [0, 1), got {fpr}")
    if threshold is not None and not math.isfinite(threshold):
        raise UserError(f"--threshold must be a finite number, got {threshold}")
    if batch_size < 1 or n_bootstrap < 0:
        raise UserError(f"--batch-size must be >= 1 and --n-bootstrap >= 0, got {batch_size} and {n_bootstrap}")


def check_methods(methods: Sequence[str], rate_method: str) -> tuple[list[str], str]:
    """(methods with the rate method added if missing, the rate method); a bare min_k etc. means k = 0.2."""
    from mia_jax.scorers import DEFAULT_K, expand_methods

    names = expand_methods(list(methods), DEFAULT_K)
    rate = expand_methods([rate_method], DEFAULT_K)
    if len(rate) != 1:
        raise UserError(f"--method-for-rate must name one method, got {rate_method!r}")
    return names + [m for m in rate if m not in names], rate[0]


def _as_books(books, encoding: str, flag: str) -> tuple[list[Book], dict]:
    if isinstance(books, (str, Path)):
        return load_books(books, encoding=encoding, flag=flag)
    out = [b if isinstance(b, Book) else Book(str(b["title"]), b["text"], _label(b.get("label"), f"{flag} book "
                                                                                  f"{b['title']!r}"))
           for b in books]
    return out, {}


def prepare(books, validation=None, *, snippets: int = SNIPPETS, snippet_words: int = SNIPPET_WORDS, seed: int = 0,
         threshold: float | None = None, encoding: str = "utf-8") -> tuple[SnippetPlan, SnippetPlan | None, dict]:
    """(audited plan, validation plan or None, {file: sha256}): every input check that needs no model."""
    if validation is None and threshold is None:
        raise UserError("no threshold to compute rates with: give --validation (labeled seen / unseen books) or "
                        "--threshold")
    audited, files = _as_books(books, encoding, "--books")
    p = make_snippets(audited, snippets, snippet_words, seed)
    if not p.snippets:
        raise UserError(f"--books: no book has {snippet_words} words (one snippet, --snippet-words); all "
                        f"{len(audited)} skipped")
    vp = None
    if validation is not None:
        val, vfiles = _as_books(validation, encoding, "--validation")
        files = {**files, **vfiles}
        unlabeled = [b.title for b in val if b.label is None]
        if unlabeled:
            raise UserError(f"--validation: book {unlabeled[0]!r} has no label; validation books need labels "
                            "(a 'label' field, 1 = seen / 0 = unseen, or seen/ and unseen/ subfolders)")
        vp = make_snippets(val, snippets, snippet_words, seed)
        lab = vp.labels
        if lab.size == 0 or lab.min() == lab.max():
            what = ("no validation book is left" if lab.size == 0 else
                    f"every kept validation book is {'seen' if lab[0] == 1 else 'unseen'}")
            raise UserError(f"--validation: {what} ({len(vp.skipped)} of {len(val)} shorter than one snippet "
                            "skipped); a threshold needs both seen (1) and unseen (0) books")
    return p, vp, files


def audit_books(loaded, books, *, validation=None, snippets: int = SNIPPETS, snippet_words: int = SNIPPET_WORDS,
                seed: int = 0, methods: Sequence[str] = METHODS, rate_method: str = RATE_METHOD, fpr: float = FPR,
                threshold: float | None = None, n_bootstrap: int = N_BOOTSTRAP, batch_size: int = 8,
                chunk_size: int = 8192, encoding: str = "utf-8", run_dirs: dict | None = None,
                resume: dict | None = None, progress: bool = True) -> BooksResult:
    """The audit of the module docstring. ``loaded``: a ``LoadedModel``; ``books`` / ``validation``: a path
    (``load_books``) or a sequence of ``Book`` or dicts with ``title``, ``text`` (and ``label``); ``threshold``: a
    given threshold on ``rate_method``'s score (required without validation); ``run_dirs`` / ``resume``:
    {"books" / "validation": folder / bool} of the scoring runs (claimed by the caller)."""
    check_options(snippets=snippets, snippet_words=snippet_words, seed=seed, fpr=fpr, threshold=threshold,
                  batch_size=batch_size, n_bootstrap=n_bootstrap)
    methods, rate_method = check_methods(methods, rate_method)
    p, vp, files = prepare(books, validation, snippets=snippets, snippet_words=snippet_words, seed=seed,
                        threshold=threshold, encoding=encoding)
    run_dirs, resume = run_dirs or {}, resume or {}
    records, vs = {}, None
    scores, records["books"] = _score(loaded, [s.text for s in p.snippets], methods, run_dirs.get("books"),
                                      resume.get("books", False), batch_size, chunk_size, progress, "scoring books")
    if vp is not None:
        vs, records["validation"] = _score(loaded, [s.text for s in vp.snippets], methods,
                                           run_dirs.get("validation"), resume.get("validation", False), batch_size,
                                           chunk_size, progress, "scoring validation books")
    facts = {f"truncated_{which}": sum(1 for r in recs if r.get("truncated")) for which, recs in records.items()}
    facts["max_length"] = loaded.max_length
    if vp is not None:
        facts["books_also_validation"] = len({vp.books[b].text for b in vp.kept} & {p.books[b].text for b in p.kept})
    config = dict(snippets=snippets, snippet_words=snippet_words, seed=seed, methods=methods, rate_method=rate_method,
                  fpr=fpr, threshold=threshold, n_bootstrap=n_bootstrap, confidence=CONFIDENCE, data_files=files)
    return analyse(p, scores, config, vp, vs, facts=facts)


def analyse(plan: SnippetPlan, scores: dict, config: dict, validation: SnippetPlan | None = None,
            validation_scores: dict | None = None, *, facts: dict | None = None) -> BooksResult:
    """Steps 3-5 of the module docstring on scored snippets (``audit_books`` after scoring, ``rebuild`` from a
    folder). ``scores`` / ``validation_scores``: method -> float64 [snippets]; ``config``: ``audit_books``'
    (``methods``, ``rate_method``, ``fpr``, ``threshold``, ``n_bootstrap``, ``seed``, ...); ``facts``: what the
    scores do not hold: ``truncated_books`` / ``truncated_validation`` (snippets longer than the model's context,
    ``max_length``) and ``books_also_validation`` (audited books whose text is a validation book's)."""
    from mia_jax import metrics

    facts = facts or {}
    rate_method, n_bootstrap, seed = config["rate_method"], config["n_bootstrap"], config["seed"]
    counts, notes = {}, []
    res = BooksResult(plan, scores, rate_method, [], [], counts=counts, notes=notes, config=config)
    if validation is not None:
        vp, vs = validation, validation_scores
        res.validation, res.validation_scores = vp, vs
        lab = vp.labels
        of_book = [s.book for s in vp.snippets]  # cluster bootstrap: a book's snippets are resampled together
        res.validation_metrics = {m: metrics.evaluate(lab, vs[m], n_bootstrap=n_bootstrap, seed=seed,
                                                      clusters=of_book) for m in config["methods"]}
        res.thresholds += [accuracy_threshold(lab, vs[rate_method]),
                           fpr_threshold(lab, vs[rate_method], config["fpr"])]
        kept = [vp.books[b] for b in vp.kept]
        same = facts.get("books_also_validation", 0)
        counts.update(validation_books=len(vp.books), validation_books_skipped=len(vp.skipped),
                      validation_books_seen=sum(b.label == 1 for b in kept),
                      validation_books_unseen=sum(b.label == 0 for b in kept), validation_snippets=len(vp.snippets),
                      validation_unscored=int((~np.isfinite(vs[rate_method])).sum()), books_also_validation=same)
        if same:
            notes.append(f"Note: {same} audited books are also validation books (the same text): their rates "
                         "are measured on the data the thresholds were chosen on.")
    if config["threshold"] is not None:
        res.thresholds.append(Threshold("given", float(config["threshold"])))
    res.rates = book_rates(plan, scores[rate_method], res.thresholds)
    counts.update(books=len(plan.kept), books_input=len(plan.books), books_skipped=len(plan.skipped),
                  snippets=len(plan.snippets), unscored=int((~np.isfinite(scores[rate_method])).sum()))
    labels = [r["label"] for r in res.rates]
    if labels and all(x is not None for x in labels):
        sep = {f"rate @ {t.name}": [r["rates"][t.name]["rate"] for r in res.rates] for t in res.thresholds}
        sep["mean score"] = [r["mean_score"] for r in res.rates]
        res.separation = {k: metrics.evaluate(labels, np.array([np.nan if x is None else x for x in v], np.float64),
                                              n_bootstrap=n_bootstrap, seed=seed) for k, v in sep.items()}
    for which in ("books", "validation"):
        n = facts.get(f"truncated_{which}")
        if n is not None:
            counts[f"truncated_{which}"] = n
        if n:
            notes.append(f"Note: {n} {which} snippets are longer than the model's context of "
                         f"{facts.get('max_length')} tokens and were scored on their first tokens only.")
    if counts["unscored"]:
        notes.append(f"Note: {counts['unscored']} audited snippets have no {rate_method} score; rates are over the "
                     "scored ones.")
    return res


# ----------------------------------------------------------------------------- outputs

def _snippet_rows(which: str, plan_: SnippetPlan, scores: dict, methods, rate_method, thresholds) -> list[list]:
    fl = {t.name: flags(scores[rate_method], t.value) for t in thresholds}
    return [[which, plan_.books[s.book].title, plan_.books[s.book].label, s.position, s.word_offset, s.n_words,
             *(_num(scores[m][i]) for m in methods), *(bool(fl[t.name][i]) for t in thresholds)]
            for i, s in enumerate(plan_.snippets)]


def _csv_bytes(header: Sequence[str], rows: Sequence[Sequence]) -> bytes:
    """A CSV file as ``report.write_csv`` writes it (None as an empty cell), in memory."""
    import io

    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def render_outputs(res: BooksResult, meta: dict) -> dict[str, bytes]:
    """{name: bytes} of books.md, books.csv, snippets.csv, histogram.png and info.json."""
    from mia_jax.audits.unlearning import figure_bytes
    from mia_jax.report import _jsonable, pyplot

    files = {"books.md": res.to_markdown().encode("utf-8")}
    names = [t.name for t in res.thresholds]
    header = ["rank", "title", "label", "snippets_available", "snippets_drawn", "snippets_scored",
              f"mean_{res.rate_method}", f"median_{res.rate_method}",
              *(f"{c}_{n}" for n in names for c in ("flagged", "rate", "ci_lo", "ci_hi"))]
    files["books.csv"] = _csv_bytes(header, [
        [rank, r["title"], r["label"], r["pieces"], r["snippets"], r["scored"], r["mean_score"], r["median_score"],
         *(v for n in names for v in (r["rates"][n]["flagged"], r["rates"][n]["rate"], *r["rates"][n]["ci"]))]
        for rank, r in enumerate(res.rates, 1)])
    methods = res.config["methods"]
    rows = _snippet_rows("audit", res.plan, res.scores, methods, res.rate_method, res.thresholds)
    if res.validation is not None:
        rows += _snippet_rows("validation", res.validation, res.validation_scores, methods, res.rate_method,
                              res.thresholds)
    files["snippets.csv"] = _csv_bytes([*_SNIPPET_COLUMNS, *methods, *(f"flagged_{n}" for n in names)], rows)
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    first = res.thresholds[0]
    edges = np.linspace(0, 100, 11)
    groups = {"all books": [r for r in res.rates]}
    if any(r["label"] is not None for r in res.rates):
        groups = {name: [r for r in res.rates if r["label"] == v] for name, v in (("seen", 1), ("unseen", 0),
                                                                                   ("unknown", None))}
    data = {k: [100 * r["rates"][first.name]["rate"] for r in v if r["rates"][first.name]["rate"] is not None]
            for k, v in groups.items()}
    data = {k: v for k, v in data.items() if v}
    ax.hist(list(data.values()), bins=edges, stacked=True, label=[f"{k} ({len(v)})" for k, v in data.items()])
    ax.set_xlabel(f"contamination rate (%), threshold: {THRESHOLD_NAMES[first.name].format(fpr=res.config['fpr'])}")
    ax.set_ylabel("books")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Contamination rate per book (paper Figure 4)")
    ax.legend(fontsize=8)
    parts = {"audited": res.scores[res.rate_method]}
    if res.validation is not None:
        lab = res.validation.labels
        v = res.validation_scores[res.rate_method]
        parts.update({"validation seen": v[lab == 1], "validation unseen": v[lab == 0]})
    parts = {k: x[np.isfinite(x)] for k, x in parts.items()}
    finite = np.concatenate([x for x in parts.values()])
    bins = np.histogram_bin_edges(finite, bins=30) if finite.size else 10
    for (k, x), color in zip(parts.items(), ("C2", "C0", "C1")):  # seen / unseen as in the left panel
        if x.size:
            bx.hist(x, bins=bins, density=True, alpha=0.45, color=color, label=f"{k} ({x.size})")
    for t, style in zip(res.thresholds, ("-", "--", ":")):
        if math.isfinite(t.value):
            bx.axvline(t.value, color="k", ls=style, lw=1,
                       label=f"threshold: {THRESHOLD_NAMES[t.name].format(fpr=res.config['fpr'])}")
    bx.set_xlabel(f"snippet score: {res.rate_method} (higher = seen)")
    bx.set_ylabel("density")
    bx.set_title("Snippet scores")
    bx.legend(fontsize=7)
    files["histogram.png"] = figure_bytes(fig)
    info = {**meta, "config": res.config, "counts": res.counts, "notes": res.notes,
            "skipped_books": res.plan.skipped,
            "skipped_validation_books": res.validation.skipped if res.validation is not None else [],
            "thresholds": [t.to_dict() for t in res.thresholds], "validation_metrics": res.validation_metrics,
            "book_separation": res.separation}
    files["info.json"] = (json.dumps(_jsonable(info), indent=2, allow_nan=False) + "\n").encode("utf-8")
    return files


REBUILD_READS = ("snippets.csv", "books.csv", "info.json")  # what --from reads (sealed in manifest.json)


def write_outputs(res: BooksResult, out: Path, meta: dict) -> None:
    """``render_outputs`` into ``out``, all or none (``files.write_all``), then sealed (``rundir.seal``: the record
    a ``--from`` rebuild checks its inputs against)."""
    from mia_jax import rundir
    from mia_jax.files import write_all

    write_all(out, render_outputs(res, meta))
    rundir.seal(out, list(REBUILD_READS))




# ----------------------------------------------------------------------------- rebuilding from a folder

_SNIPPET_COLUMNS = ("set", "title", "label", "snippet", "word_offset", "n_words")


def _read_info(folder: Path) -> dict:
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
    from mia_jax.audits.unlearning import cell_bool, cell_float, cell_int

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
            cols[m].append(cell_float(r, m, where))  # written by _num: empty = not finite
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
    from mia_jax import rundir
    from mia_jax.audits.unlearning import cell_int, read_csv_rows

    folder = Path(folder)
    rundir.verify(folder, list(REBUILD_READS))
    info = _read_info(folder)
    cfg, counts = info["config"], info["counts"]
    methods = cfg["methods"]
    path = folder / "snippets.csv"
    rows = read_csv_rows(path, (*_SNIPPET_COLUMNS, *methods), "mia-jax audit-books")
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


# ----------------------------------------------------------------------------- mia-jax audit-books

def add_parser(sub) -> argparse.ArgumentParser:
    """The ``audit-books`` subparser (its options: ``mia_jax.commands.audit_books``)."""
    from mia_jax.commands import audit_books as command_module  # the command's own module (until cli.py uses it)

    p = sub.add_parser(command_module.NAME, help=command_module.HELP)
    command_module.add_arguments(p)
    return p


def command(args) -> BooksResult:
    """`mia-jax audit-books`: every input checked and the model loaded before anything is written."""
    from mia_jax import __version__, models, rundir, runner

    if args.source is not None:
        return rebuild_command(args)
    if args.books is None or args.model is None:
        raise UserError("audit-books needs --books and --model (or --from DIR to rebuild an audit's outputs)")
    check_options(snippets=args.snippets, snippet_words=args.snippet_words, seed=args.seed, fpr=args.fpr,
                  threshold=args.threshold, batch_size=args.batch_size, n_bootstrap=args.n_bootstrap)
    methods, rate_method = check_methods(args.methods, args.method_for_rate)
    p, vp, files = prepare(args.books, args.validation, snippets=args.snippets, snippet_words=args.snippet_words,
                        seed=args.seed, threshold=args.threshold, encoding=args.encoding)
    skipped = [f"audit-books: {_books(len(pl.skipped), name)} shorter than one snippet ({args.snippet_words} words) "
               f"skipped: {', '.join(s['title'] for s in pl.skipped[:10])}{' ...' if len(pl.skipped) > 10 else ''}"
               for name, pl in (("", p), ("validation ", vp)) if pl is not None and pl.skipped]
    out = rundir.check_path(args.out)
    loaded = models.load(args.model, dtype=args.dtype, allow_download=args.allow_download)
    sets = {"books": p, "validation": vp}
    fingerprint = audit_fingerprint(args, loaded, files, methods, rate_method)
    # the folder is this audit's (or refused untouched); each scoring run is claimed on its own inside it
    with rundir.claim(out, fingerprint, overwrite=args.overwrite), contextlib.ExitStack() as stack:
        for line in skipped:  # once the folder is ours: a refusal stays one line
            print(line, file=sys.stderr)
        run_dirs, resume = {}, {}
        for which, pl in sets.items():
            if pl is None:
                continue
            run_dirs[which] = rundir.check_path(out / which)
            fp = runner.run_fingerprint(loaded, [s.text for s in pl.snippets], None, methods, data_files=files,
                                        labeled=False, encoding=args.encoding, snippets=args.snippets,
                                        snippet_words=args.snippet_words, seed=args.seed, batch_size=args.batch_size,
                                        chunk_size=args.chunk_size, dtype=args.dtype)
            resume[which] = stack.enter_context(rundir.claim(run_dirs[which], fp, overwrite=args.overwrite))
            if resume[which]:
                print(f"resuming the {which} run in {run_dirs[which]}", file=sys.stderr)
        res = audit_books(loaded, p.books, validation=vp.books if vp is not None else None, snippets=args.snippets,
                          snippet_words=args.snippet_words, seed=args.seed, methods=methods, rate_method=rate_method,
                          fpr=args.fpr, threshold=args.threshold, n_bootstrap=args.n_bootstrap,
                          batch_size=args.batch_size, chunk_size=args.chunk_size, run_dirs=run_dirs, resume=resume,
                          progress=not args.no_progress)
        res.config["data_files"] = files
        meta = {"command": " ".join(sys.argv), "package_version": __version__,
                "books": str(args.books), "validation": args.validation,
                "model": {"name": loaded.name, "source": loaded.source, "files": loaded.files, "dtype": loaded.dtype,
                          "add_bos": loaded.add_bos, "max_length": loaded.max_length}}
        write_outputs(res, out, meta)
    print(res.to_markdown())
    print(f"wrote {out}/", file=sys.stderr)
    return res


# Options of `audit-books` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("source", "out", "overwrite", "no_progress", "allow_download",  # not what is computed
                      "books", "validation", "model",  # by their files' SHA-256 instead
                      "methods", "method_for_rate")  # expanded (methods, rate_method)


def audit_fingerprint(args, loaded, data_files: dict, methods: list[str], rate_method: str) -> dict:
    """What makes an audit-books folder (``rundir.claim``): the model's and every book file's SHA-256 and every
    option that can change a result; a folder holding anything else is refused."""
    from mia_jax import __version__

    def resolved(files):
        return {str(Path(f).resolve()): h for f, h in files.items()}

    options = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_IN_FINGERPRINT and k != "command"}
    return {"command": "audit-books", "model_files": resolved(loaded.files), "data_files": resolved(data_files),
            "methods": methods, "rate_method": rate_method, **options, "package_version": __version__}


def rebuild_command(args) -> BooksResult:
    """`mia-jax audit-books --from DIR --out OUT`: ``rebuild``, then the outputs into OUT (new, empty, an earlier
    rebuild of DIR, or DIR itself: every output computed before any is written), info.json keeping DIR's command,
    model and data files and noting the rebuild."""
    from mia_jax import __version__, rundir
    from mia_jax.entry import check_out
    from mia_jax.files import write_all

    given = [f for f, v in (("--books", args.books), ("--model", args.model), ("--validation", args.validation),
                            ("--threshold", args.threshold)) if v is not None]
    if given:
        raise UserError(f"--from rebuilds with the settings of the audit in its folder; leave out {', '.join(given)}")
    source, out = Path(args.source), check_out(args.out)
    if not source.is_dir():
        raise UserError(f"--from {source}: not a folder (the --out folder of an audit-books run)")
    res = rebuild(source)
    meta = {**_read_info(source), "rebuilt": {"command": " ".join(sys.argv), "from": str(source),
                                              "package_version": __version__}}
    files = render_outputs(res, meta)
    with rundir.rebuild_into(out, [source], "audit-books"):
        write_all(out, files)
        rundir.seal(out, list(REBUILD_READS))
    print(res.to_markdown())
    print(f"wrote {out}/", file=sys.stderr)
    return res

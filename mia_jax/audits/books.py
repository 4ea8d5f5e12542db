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
rebuilt without the model: ``books_rebuild.rebuild(folder)`` (``mia-jax audit-books --from DIR --out OUT``) reads
DIR/snippets.csv (every snippet's scores, written at full precision: a float's shortest repr, a non-finite score as
an empty cell, which every step leaves out like NaN), books.csv (snippets available per book) and info.json (the
settings, the skipped books, the truncation counts) and runs the same ``analyse``: OUT's books.md, books.csv and
snippets.csv are DIR's byte for byte. A committed results folder can so be recomputed, or checked, by anyone.

The parts: this module (the audit: its settings, scoring and analysis), ``books_snippets`` (step 1: the books and
their snippets), ``books_rates`` (steps 3-4: thresholds and rates), ``books_report`` (books.md, the CSV files, the
histogram, info.json), ``books_rebuild`` (reading an audit's folder back) and the command,
``mia_jax.commands.audit_books``.

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

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from mia_jax.evaluation import metrics
from mia_jax.audits.books_rates import (CONFIDENCE, FPR, Threshold, accuracy_threshold, book_rates,
                                        fpr_threshold)
from mia_jax.audits.books_snippets import SNIPPET_WORDS, SNIPPETS, SnippetPlan, as_books, make_snippets
from mia_jax.audits.common import score_texts
from mia_jax.errors import UserError
from mia_jax.scorers import DEFAULT_K, expand_methods

RATE_METHOD = "min_k@0.2"
METHODS = ("min_k@0.2", "ppl", "zlib", "lowercase")
N_BOOTSTRAP = 1000


@dataclass(frozen=True)
class BooksConfig:
    """The settings of an audit (``mia-jax audit-books``' options of the same names; ``rate_method``:
    ``--method-for-rate``; ``encoding``: of the book files)."""
    snippets: int = SNIPPETS
    snippet_words: int = SNIPPET_WORDS
    seed: int = 0
    methods: Sequence[str] = METHODS
    rate_method: str = RATE_METHOD
    fpr: float = FPR
    threshold: float | None = None
    n_bootstrap: int = N_BOOTSTRAP
    batch_size: int = 8
    chunk_size: int | None = None  # None: stats.default_chunk()
    encoding: str = "utf-8"


def books_phrase(n: int, kind: str = "") -> str:
    """``n`` books, said in words: "1 book", "3 validation books" (``kind``: "validation ")."""
    return f"{n} {kind}book{'' if n == 1 else 's'}"


@dataclass
class BooksResult:
    """An audit's result: what ``books_report`` writes and ``books_rebuild`` reads back."""
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


def check_options(cfg: BooksConfig) -> None:
    """UserError for a setting of ``cfg`` out of range (before anything is loaded or written)."""
    if cfg.snippets < 1 or cfg.snippet_words < 1:
        raise UserError(f"--snippets and --snippet-words must be >= 1, got {cfg.snippets} and {cfg.snippet_words}")
    if cfg.seed < 0:
        raise UserError(f"--seed must be >= 0, got {cfg.seed}")
    if not 0 <= cfg.fpr < 1:
        raise UserError(f"--fpr must be in [0, 1), got {cfg.fpr}")
    if cfg.threshold is not None and not math.isfinite(cfg.threshold):
        raise UserError(f"--threshold must be a finite number, got {cfg.threshold}")
    if cfg.batch_size < 1 or cfg.n_bootstrap < 0:
        raise UserError(f"--batch-size must be >= 1 and --n-bootstrap >= 0, got {cfg.batch_size} and "
                        f"{cfg.n_bootstrap}")


def check_methods(methods: Sequence[str], rate_method: str) -> tuple[list[str], str]:
    """(``methods`` with ``rate_method`` added if missing, the rate method), each expanded (a bare min_k etc. means
    k = 0.2); UserError for an unknown method or a rate method that is not one."""
    names = expand_methods(list(methods), DEFAULT_K)
    rate = expand_methods([rate_method], DEFAULT_K)
    if len(rate) != 1:
        raise UserError(f"--method-for-rate must name one method, got {rate_method!r}")
    return names + [m for m in rate if m not in names], rate[0]


def prepare(books, validation=None, cfg: BooksConfig = BooksConfig(),
            data_dir=None) -> tuple[SnippetPlan, SnippetPlan | None, dict]:
    """(audited plan, validation plan or None, {file: sha256}) of ``books`` and ``validation`` (each: a path or a
    sequence of books, ``books_snippets.as_books``) cut and drawn as ``cfg`` says: every input check that needs no
    model. ``data_dir``: the TFDS data folder of a ``tfds:`` spec."""
    if validation is None and cfg.threshold is None:
        raise UserError("no threshold to compute rates with: give --validation (labeled seen / unseen books) or "
                        "--threshold")
    audited, files = as_books(books, cfg.encoding, "--books", data_dir)
    p = make_snippets(audited, cfg.snippets, cfg.snippet_words, cfg.seed)
    if not p.snippets:
        raise UserError(f"--books: no book has {cfg.snippet_words} words (one snippet, --snippet-words); all "
                        f"{len(audited)} skipped")
    vp = None
    if validation is not None:
        val, vfiles = as_books(validation, cfg.encoding, "--validation", data_dir)
        files = {**files, **vfiles}
        unlabeled = [b.title for b in val if b.label is None]
        if unlabeled:
            raise UserError(f"--validation: book {unlabeled[0]!r} has no label; validation books need labels "
                            "(a 'label' field, 1 = seen / 0 = unseen, or seen/ and unseen/ subfolders)")
        vp = make_snippets(val, cfg.snippets, cfg.snippet_words, cfg.seed)
        lab = vp.labels
        if lab.size == 0 or lab.min() == lab.max():
            what = ("no validation book is left" if lab.size == 0 else
                    f"every kept validation book is {'seen' if lab[0] == 1 else 'unseen'}")
            raise UserError(f"--validation: {what} ({len(vp.skipped)} of {len(val)} shorter than one snippet "
                            "skipped); a threshold needs both seen (1) and unseen (0) books")
    return p, vp, files


def audit_books(loaded, books, validation=None, cfg: BooksConfig = BooksConfig(), *, run_dirs: dict | None = None,
                resume: dict | None = None, progress: bool = True) -> BooksResult:
    """The audit of the module docstring. ``loaded``: a ``LoadedModel``; ``books`` / ``validation``: a path
    (``books_snippets.load_books``) or a sequence of ``Book`` or dicts with ``title``, ``text`` (and ``label``);
    ``cfg``: the settings (``cfg.threshold``: a given threshold on the rate method's score, required without
    validation); ``run_dirs`` / ``resume``: {"books" / "validation": folder / bool} of the scoring runs (claimed by
    the caller); ``progress``: progress bars. Returns the result (``analyse``)."""
    check_options(cfg)
    methods, rate_method = check_methods(cfg.methods, cfg.rate_method)
    p, vp, files = prepare(books, validation, cfg)
    run_dirs, resume = run_dirs or {}, resume or {}
    records, vs = {}, None
    scores, records["books"] = score_texts(loaded, [s.text for s in p.snippets], methods, run_dirs.get("books"),
                                           resume.get("books", False), cfg.batch_size, cfg.chunk_size, progress,
                                           "scoring books")
    if vp is not None:
        vs, records["validation"] = score_texts(loaded, [s.text for s in vp.snippets], methods,
                                                run_dirs.get("validation"), resume.get("validation", False),
                                                cfg.batch_size, cfg.chunk_size, progress, "scoring validation books")
    facts = {f"truncated_{which}": sum(1 for r in recs if r.get("truncated")) for which, recs in records.items()}
    facts["max_length"] = loaded.max_length
    if vp is not None:
        facts["books_also_validation"] = len({vp.books[b].text for b in vp.kept} & {p.books[b].text for b in p.kept})
    config = dict(snippets=cfg.snippets, snippet_words=cfg.snippet_words, seed=cfg.seed, methods=methods,
                  rate_method=rate_method, fpr=cfg.fpr, threshold=cfg.threshold, n_bootstrap=cfg.n_bootstrap,
                  confidence=CONFIDENCE, data_files=files)
    return analyse(p, scores, config, vp, vs, facts=facts)


def analyse(plan: SnippetPlan, scores: dict, config: dict, validation: SnippetPlan | None = None,
            validation_scores: dict | None = None, *, facts: dict | None = None) -> BooksResult:
    """Steps 3-5 of the module docstring on scored snippets (``audit_books`` after scoring, ``rebuild`` from a
    folder). ``scores`` / ``validation_scores``: method -> float64 [snippets]; ``config``: ``audit_books``'
    (``methods``, ``rate_method``, ``fpr``, ``threshold``, ``n_bootstrap``, ``seed``, ...); ``facts``: what the
    scores do not hold: ``truncated_books`` / ``truncated_validation`` (snippets longer than the model's context,
    ``max_length``) and ``books_also_validation`` (audited books whose text is a validation book's)."""
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

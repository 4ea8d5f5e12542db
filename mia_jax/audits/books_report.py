"""The copyrighted-book audit's outputs (:mod:`mia_jax.audits.books`): books.md (the report, also printed),
books.csv (the ranked rates), snippets.csv (every snippet's scores at full precision and flags), histogram.png and
info.json; written all or none and sealed (the record a ``--from`` rebuild checks its inputs against)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from mia_jax.audits.books import BooksResult, books_phrase
from mia_jax.audits.books_rates import flags
from mia_jax.audits.books_snippets import SnippetPlan
from mia_jax.audits.common import finite_or_none, label_axes, write_sealed
from mia_jax.evaluation.report import csv_bytes, figure_bytes, fmt, jsonable, markdown, markdown_table, pyplot

THRESHOLD_NAMES = {"accuracy": "max. validation accuracy", "fpr": "validation FPR <= {fpr:g}",
                   "given": "given (--threshold)"}
REBUILD_READS = ("snippets.csv", "books.csv", "info.json")  # what --from reads (sealed in manifest.json)
SNIPPET_COLUMNS = ("set", "title", "label", "snippet", "word_offset", "n_words")  # then the methods and flags


def threshold_name(name: str, fpr: float) -> str:
    """How the report names the threshold ``name`` ("accuracy", "fpr", "given"; ``fpr``: the audit's target)."""
    return THRESHOLD_NAMES[name].format(fpr=fpr)


# ----------------------------------------------------------------------------- books.md

def to_markdown(res: BooksResult) -> str:
    """books.md of ``res``: the snippets drawn, the validation AUROCs, the thresholds, the ranked rates, the share
    of books above 50%, the book-level separation and the notes. Returns the markdown."""
    c, cfg = res.counts, res.config
    skipped = res.plan.skipped
    lines = ["## Copyrighted-book audit (Shi et al. 2023, section 5)\n",
             f"{c['books']} books -> {c['snippets']} snippets of {cfg['snippet_words']} words (up to "
             f"{cfg['snippets']} per book, seed {cfg['seed']})"
             + (f"; {books_phrase(len(skipped))} shorter than one snippet skipped: "
                + ", ".join(s['title'] for s in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
                if skipped else "") + "."]
    if res.validation is not None:
        v = res.validation
        lab = v.labels
        lines.append(f"Validation: {c['validation_books_seen']} seen and {c['validation_books_unseen']} unseen "
                     f"books -> {int(lab.sum())} seen and {int(lab.size - lab.sum())} unseen snippets"
                     + (f" ({books_phrase(len(v.skipped))} shorter than one snippet skipped)" if v.skipped else "")
                     + ".")
        lines.append(f"\n### Validation AUROC per method (Figure 3; intervals resample the "
                     f"{books_phrase(len(v.kept), 'validation ')}, each with all its snippets)\n\n"
                     + markdown_table(res.validation_metrics))
    tp = [[threshold_name(t.name, cfg["fpr"]), "+inf (flags nothing)" if t.value == math.inf
           else fmt(t.value, 4), fmt(t.accuracy), fmt(t.tpr), fmt(t.fpr)] for t in res.thresholds]
    lines.append(f"\n### Thresholds on {res.rate_method} (a snippet is flagged when its score is at or above)\n\n"
                 + markdown(["Threshold", "Value", "Val. accuracy", "Val. TPR", "Val. FPR"], tp))
    lines.append(_rates_table(res))
    lines += _above_half(res)
    if res.separation:
        lines.append(_separation_table(res.separation))
    lines += [f"\n{n}" for n in res.notes]
    return "\n".join(lines) + "\n"


def _rates_table(res: BooksResult) -> str:
    """The ranked contamination rates (Table 2) with their heading."""
    fpr = res.config["fpr"]
    labeled = any(r["label"] is not None for r in res.rates)
    hdr = ["Rank", "Book", "Snippets"] + [f"Rate @ {threshold_name(t.name, fpr)} [95% CI]"
                                          for t in res.thresholds] + ["Mean score"] + (["Label"] if labeled else [])
    rows = []
    for rank, r in enumerate(res.rates, 1):
        cells = [str(rank), r["title"].replace("|", "\\|"), f"{r['snippets']}" + (
            f" ({r['snippets'] - r['scored']} unscored)" if r["scored"] < r["snippets"] else "")]
        for t in res.thresholds:
            x = r["rates"][t.name]
            cells.append("n/a" if x["rate"] is None else
                         f"{fmt(100 * x['rate'], 1)}% [{fmt(100 * x['ci'][0], 1)}, {fmt(100 * x['ci'][1], 1)}]")
        cells.append(fmt(r["mean_score"]))
        if labeled:
            cells.append({1: "seen", 0: "unseen", None: "?"}[r["label"]])
        rows.append(cells)
    return (f"\n### Contamination rate per book (Table 2), ranked\n\nRate: the share of a book's snippets "
            f"flagged by {res.rate_method}, with a Clopper-Pearson 95% interval.\n\n" + markdown(hdr, rows))


def _above_half(res: BooksResult) -> list[str]:
    """Per threshold: the books with a rate above 50% (the statistic of the paper's Figure 4)."""
    lines = []
    for t in res.thresholds:
        rates = [r["rates"][t.name]["rate"] for r in res.rates if r["rates"][t.name]["rate"] is not None]
        above = sum(x > 0.5 for x in rates)
        lines.append(f"Books with a rate above 50% ({threshold_name(t.name, res.config['fpr'])}): "
                     f"{above} of {len(rates)}" + (f" ({100 * above / len(rates):.0f}%)" if rates else "") + ".")
    return lines


def _separation_table(separation: dict) -> str:
    """How well the book-level quantities separate seen from unseen books, with its heading."""
    srows = []
    for key, m in separation.items():
        ci = m.get("auroc_ci")
        srows.append([key, fmt(m.get("auroc")) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""),
                      str(m.get("n_members")), str(m.get("n_nonmembers")), m.get("note") or ""])
    return ("\n### Does the book-level score separate seen from unseen books?\n\nAUROC over the audited "
            "books (bootstrap interval resampling books).\n\n"
            + markdown(["Per-book quantity", "AUROC [95% CI]", "Seen books", "Unseen books", "Note"], srows))


# ----------------------------------------------------------------------------- the files

def _snippet_rows(which: str, plan_: SnippetPlan, scores: dict, methods, rate_method, thresholds) -> list[list]:
    fl = {t.name: flags(scores[rate_method], t.value) for t in thresholds}
    return [[which, plan_.books[s.book].title, plan_.books[s.book].label, s.position, s.word_offset, s.n_words,
             *(finite_or_none(scores[m][i]) for m in methods), *(bool(fl[t.name][i]) for t in thresholds)]
            for i, s in enumerate(plan_.snippets)]


def render_outputs(res: BooksResult, meta: dict) -> dict[str, bytes]:
    """{name: bytes} of books.md, books.csv, snippets.csv, histogram.png and info.json of ``res`` (info.json: the
    entries of ``meta`` (command, model, ...) first, then the result's)."""
    files = {"books.md": to_markdown(res).encode("utf-8")}
    names = [t.name for t in res.thresholds]
    header = ["rank", "title", "label", "snippets_available", "snippets_drawn", "snippets_scored",
              f"mean_{res.rate_method}", f"median_{res.rate_method}",
              *(f"{c}_{n}" for n in names for c in ("flagged", "rate", "ci_lo", "ci_hi"))]
    files["books.csv"] = csv_bytes(header, [
        [rank, r["title"], r["label"], r["pieces"], r["snippets"], r["scored"], r["mean_score"], r["median_score"],
         *(v for n in names for v in (r["rates"][n]["flagged"], r["rates"][n]["rate"], *r["rates"][n]["ci"]))]
        for rank, r in enumerate(res.rates, 1)])
    methods = res.config["methods"]
    rows = _snippet_rows("audit", res.plan, res.scores, methods, res.rate_method, res.thresholds)
    if res.validation is not None:
        rows += _snippet_rows("validation", res.validation, res.validation_scores, methods, res.rate_method,
                              res.thresholds)
    files["snippets.csv"] = csv_bytes([*SNIPPET_COLUMNS, *methods, *(f"flagged_{n}" for n in names)], rows)
    files["histogram.png"] = histogram_png(res)
    info = {**meta, "config": res.config, "counts": res.counts, "notes": res.notes,
            "skipped_books": res.plan.skipped,
            "skipped_validation_books": res.validation.skipped if res.validation is not None else [],
            "thresholds": [t.to_dict() for t in res.thresholds], "validation_metrics": res.validation_metrics,
            "book_separation": res.separation}
    files["info.json"] = (json.dumps(jsonable(info), indent=2, allow_nan=False) + "\n").encode("utf-8")
    return files


def histogram_png(res: BooksResult) -> bytes:
    """histogram.png of ``res``: the books' rates at the first threshold (the paper's Figure 4) beside the snippet
    scores of the audited and validation books with the thresholds. Returns the PNG bytes."""
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
    ax.set_xlabel(f"contamination rate (%), threshold: {threshold_name(first.name, res.config['fpr'])}")
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
                       label=f"threshold: {threshold_name(t.name, res.config['fpr'])}")
    label_axes(bx, f"snippet score: {res.rate_method} (higher = seen)", "density", "Snippet scores", 7)
    return figure_bytes(fig)


def write_outputs(res: BooksResult, out: Path, meta: dict) -> None:
    """``render_outputs`` of ``res`` and ``meta`` into the folder ``out``, all or none, then sealed
    (``common.write_sealed``)."""
    write_sealed(out, render_outputs(res, meta), REBUILD_READS)

"""The copyrighted-book audit's thresholds and rates (steps 3-4 of :mod:`mia_jax.audits.books`): the two
thresholds a labeled validation set sets on the rate method's score (maximum accuracy; highest TPR within an FPR),
the snippets a threshold flags, and each book's contamination rate with its Clopper-Pearson interval."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mia_jax.audits.books_snippets import SnippetPlan
from mia_jax.audits.common import finite_or_none
from mia_jax.errors import UserError

FPR = 0.05
CONFIDENCE = 0.95


@dataclass
class Threshold:
    """A threshold on the rate method's score and, when set on validation, its accuracy, TPR and FPR there."""
    name: str  # "accuracy", "fpr" or "given"
    value: float  # flag a snippet when its score >= value (+inf: none)
    accuracy: float | None = None  # on the validation snippets
    tpr: float | None = None
    fpr: float | None = None

    def to_dict(self) -> dict:
        """The threshold as info.json records it."""
        return {"name": self.name, "value": finite_or_none(self.value), "flags_nothing": self.value == math.inf,
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
    from scipy.stats import binomtest  # here, as scipy.stats is slow to import (the CLI's start-up)

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def flags(scores, threshold: float) -> np.ndarray:
    """bool [N]: finite score >= threshold (NaN, +-inf: False; as in the rates, which count finite scores only)."""
    sc = np.asarray(scores, np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(sc) & (sc >= threshold)


def book_rates(plan: SnippetPlan, scores, thresholds: Sequence[Threshold],
               confidence: float = CONFIDENCE) -> list[dict]:
    """Per kept book of ``plan`` (``scores``: its snippets' scores of the rate method): snippet counts, mean / median
    score, and per threshold the flagged count, rate and ``confidence`` interval; ranked by the rate at the first
    threshold (ties by title). Returns the rows."""
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

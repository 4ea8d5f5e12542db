"""Detection metrics: ROC, AUROC, TPR@FPR, FPR@TPR, best balanced accuracy, bootstrap CIs.

Conventions
-----------
* Scores are oriented **higher = more likely a member**; label 1 = member, 0 = non-member.
  A text is predicted a member when ``score >= threshold``.
* **TPR@FPR (e.g. TPR@5%FPR)** is the largest true-positive rate over ROC operating points whose
  false-positive rate is <= the target, i.e. the TPR of the most permissive threshold that still meets
  the FPR budget on the evaluated non-members. It is conservative: no interpolation between ROC points
  (with 100 non-members, TPR@0.1%FPR is the TPR at FPR = 0).
* **FPR@95%TPR** is the smallest FPR over ROC operating points whose TPR is >= 0.95.
* **AUROC** is the Mann-Whitney probability that a random member outscores a random non-member,
  ties counted 1/2 (scikit-learn's ``roc_auc_score``).
* The low-level functions require finite scores and both classes, and raise ``ValueError`` otherwise.
  :func:`evaluate` instead counts and excludes NaN/inf scores (``n_nan``), and returns ``None`` metrics
  with an explanatory ``note`` when only one class remains.
* Bootstrap CIs (in :func:`evaluate`) are seeded percentile intervals over **stratified** resamples:
  members and non-members are resampled separately, with replacement, at their observed counts, so every
  resample has both classes and the same class balance as the data.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn import metrics as _skm

FPR_TARGETS = (0.001, 0.01, 0.05)
_TPR_KEYS = {0.001: "tpr_at_0.1pct_fpr", 0.01: "tpr_at_1pct_fpr", 0.05: "tpr_at_5pct_fpr"}
_CHUNK_ELEMENTS = 4_000_000  # bootstrap resamples are processed in blocks of about this many values


def _as_labels(labels) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {lab.shape}")
    if lab.dtype == bool:
        return lab.astype(np.int64)
    try:
        lab_f = lab.astype(np.float64)
    except (TypeError, ValueError):
        bad = sorted({str(v) for v in lab.tolist()} - {"0", "1"})
        raise ValueError(f"labels must be 0 (non-member) or 1 (member); found {bad[:10]}") from None
    bad_mask = ~np.isin(lab_f, (0.0, 1.0))  # NaN is not in {0, 1}
    if bad_mask.any():
        bad = sorted({repr(v) for v in lab[bad_mask].tolist()})
        raise ValueError(
            f"labels must be 0 (non-member) or 1 (member); found {len(bad)} other value(s): "
            f"{', '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}"
        )
    return lab_f.astype(np.int64)


def _as_scores(scores, n: int) -> np.ndarray:
    sc = np.asarray(scores, dtype=np.float64)
    if sc.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {sc.shape}")
    if sc.shape[0] != n:
        raise ValueError(f"labels and scores differ in length: {n} labels, {sc.shape[0]} scores")
    return sc


def _checked(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    """Validated (labels, scores) for the low-level functions: finite scores, both classes present."""
    lab = _as_labels(labels)
    sc = _as_scores(scores, lab.shape[0])
    n_bad = int((~np.isfinite(sc)).sum())
    if n_bad:
        raise ValueError(f"{n_bad} NaN/inf score(s); drop them first or use metrics.evaluate(), "
                         "which counts and excludes them")
    n_pos = int(lab.sum())
    if n_pos == 0 or n_pos == lab.shape[0]:
        raise ValueError(f"need both classes; got {n_pos} members and {lab.shape[0] - n_pos} non-members")
    return lab, sc


def roc_curve(labels, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) at every distinct score (scikit-learn, ``drop_intermediate=False``).

    The first point is (0, 0) at threshold +inf."""
    lab, sc = _checked(labels, scores)
    return _skm.roc_curve(lab, sc, drop_intermediate=False)


def auroc(labels, scores) -> float:
    """Area under the ROC curve (Mann-Whitney U / (n_members * n_nonmembers), ties count 1/2)."""
    lab, sc = _checked(labels, scores)
    return float(_skm.roc_auc_score(lab, sc))


def tpr_at_fpr(labels, scores, fpr: float) -> float:
    """Largest TPR over ROC points with FPR <= ``fpr`` (conservative, no interpolation)."""
    f, t, _ = roc_curve(labels, scores)
    return float(t[f <= fpr].max())  # (0, 0) always qualifies


def fpr_at_tpr(labels, scores, tpr: float) -> float:
    """Smallest FPR over ROC points with TPR >= ``tpr`` (the point (1, 1) always qualifies)."""
    f, t, _ = roc_curve(labels, scores)
    return float(f[t >= tpr].min())


def best_balanced_accuracy(labels, scores) -> tuple[float, float]:
    """(max over thresholds of (TPR + TNR) / 2, that threshold); predict member when score >= threshold.

    Only finite thresholds (observed scores) are considered; ties go to the highest threshold."""
    f, t, thr = roc_curve(labels, scores)
    finite = np.isfinite(thr)
    bal = (t[finite] + 1.0 - f[finite]) / 2.0
    i = int(np.argmax(bal))
    return float(bal[i]), float(thr[finite][i])


# ---------------------------------------------------------------- bootstrap (vectorised, stratified)

def _auroc_rows(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC of each row: pos [B, P], neg [B, N] -> [B] (rank-sum form, average ranks for ties)."""
    n_pos, n_neg = pos.shape[1], neg.shape[1]
    ranks = rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    u = ranks[:, :n_pos].sum(axis=1) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def _max_false_positives(n_neg: int, fpr: float) -> int:
    """Largest k with k / n_neg <= fpr, using the same float comparison as the ROC-curve path."""
    ks = np.arange(n_neg + 1)
    return int(ks[ks / n_neg <= fpr].max())


def _tpr_at_fpr_rows(pos: np.ndarray, neg: np.ndarray, fpr: float) -> np.ndarray:
    """TPR@FPR of each row. With k the allowed false positives and v the (k+1)-th largest
    non-member score, the best qualifying threshold admits exactly the members scoring > v."""
    k = _max_false_positives(neg.shape[1], fpr)
    if k >= neg.shape[1]:
        return np.ones(pos.shape[0])
    v = -np.partition(-neg, k, axis=1)[:, k]
    return (pos > v[:, None]).mean(axis=1)


def _bootstrap(pos, neg, n_bootstrap: int, seed: int, fpr: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (pos.size + neg.size))
    aucs, tprs = [], []
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        p = pos[rng.integers(0, pos.size, size=(b, pos.size))]
        q = neg[rng.integers(0, neg.size, size=(b, neg.size))]
        aucs.append(_auroc_rows(p, q))
        tprs.append(_tpr_at_fpr_rows(p, q, fpr))
    return np.concatenate(aucs), np.concatenate(tprs)


def _interval(values: np.ndarray, confidence: float) -> list[float]:
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def evaluate(labels, scores, *, n_bootstrap: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict:
    """All metrics for one method as a JSON-serialisable dict (see the module docstring).

    NaN/inf scores are counted in ``n_nan`` and excluded (and mentioned in ``note``). With only one class
    among the scored rows every metric is ``None`` and ``note`` says why. ``auroc_ci`` and
    ``tpr_at_5pct_fpr_ci`` are stratified percentile-bootstrap intervals, identical for the same ``seed``;
    ``None`` when ``n_bootstrap == 0``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    lab = _as_labels(labels)
    sc = _as_scores(scores, lab.shape[0])
    finite = np.isfinite(sc)
    lab, sc = lab[finite], sc[finite]
    n_nan = int((~finite).sum())
    n_pos = int(lab.sum())
    n_neg = int(lab.shape[0] - n_pos)
    out: dict = {
        "n": int(finite.shape[0]), "n_scored": int(lab.shape[0]), "n_nan": n_nan,
        "n_members": n_pos, "n_nonmembers": n_neg,
        "auroc": None, "auroc_ci": None,
        **{_TPR_KEYS[f]: None for f in FPR_TARGETS},
        "tpr_at_5pct_fpr_ci": None, "fpr_at_95pct_tpr": None,
        "best_balanced_accuracy": None, "best_threshold": None, "note": None,
    }
    notes = []
    if n_nan:
        notes.append(f"{n_nan} NaN/inf score{'s' if n_nan != 1 else ''} excluded")
    if n_pos == 0 or n_neg == 0:
        notes.insert(0, f"AUROC undefined: only one class among scored examples "
                        f"({n_pos} members, {n_neg} non-members)")
        out["note"] = "; ".join(notes)
        return out
    out["auroc"] = auroc(lab, sc)
    for f in FPR_TARGETS:
        out[_TPR_KEYS[f]] = tpr_at_fpr(lab, sc, f)
    out["fpr_at_95pct_tpr"] = fpr_at_tpr(lab, sc, 0.95)
    out["best_balanced_accuracy"], out["best_threshold"] = best_balanced_accuracy(lab, sc)
    if n_bootstrap:
        aucs, tprs = _bootstrap(sc[lab == 1], sc[lab == 0], n_bootstrap, seed, 0.05)
        out["auroc_ci"] = _interval(aucs, confidence)
        out["tpr_at_5pct_fpr_ci"] = _interval(tprs, confidence)
    out["note"] = "; ".join(notes) or None
    return out


def scores_by_method(records: Sequence[dict], methods: Sequence[str]) -> dict[str, np.ndarray]:
    """{method: float64 [N]} from scoring records (``{"scores": {method: float or null}}``), null -> NaN."""
    return {m: np.array([np.nan if r["scores"][m] is None else r["scores"][m] for r in records], np.float64)
            for m in methods}


def evaluate_records(records: Sequence[dict], methods: Sequence[str], labels: Sequence[int], *,
                     n_bootstrap: int = 1000, seed: int = 0, groups: Sequence | None = None) -> dict:
    """:func:`evaluate` for every method from scoring records (the runner's, null scores counted as NaN):
    ``{method: metrics}``, in ``methods`` order. With ``groups`` (one key per record, e.g. its dataset):
    ``{group: {method: metrics}}`` over each group's records, groups in order of first appearance."""
    if groups is not None:
        rows: dict = {}
        for i, g in enumerate(groups):
            rows.setdefault(g, []).append(i)
        return {g: evaluate_records([records[i] for i in idx], methods, [labels[i] for i in idx],
                                    n_bootstrap=n_bootstrap, seed=seed) for g, idx in rows.items()}
    scores = scores_by_method(records, methods)
    return {m: evaluate(labels, scores[m], n_bootstrap=n_bootstrap, seed=seed) for m in methods}

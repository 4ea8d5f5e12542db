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
  with an explanatory ``note`` when a class has fewer than ``MIN_PER_CLASS`` (10) scored examples (one class
  left included); :func:`evaluate_mean` does the same per group, :func:`paired_bootstrap` and
  :func:`subset_bootstrap` raise ``ValueError`` with that reason (every caller reports the comparison as n/a).
* Bootstrap CIs (in :func:`evaluate`) are seeded percentile intervals over **stratified** resamples:
  members and non-members are resampled separately, with replacement, at their observed counts, so every
  resample has both classes and the same class balance as the data.
* **Comparisons** (:func:`paired_bootstrap`): two score vectors on the same examples (two methods, or two models
  scoring one eval set) share every resample, and the interval is that of the difference A - B; a comparison is
  stated ("A > B") only when that interval excludes 0, else it is "not distinguishable". :func:`subset_bootstrap`
  does the same for two member subsets against shared non-members, :func:`evaluate_mean` gives the interval of
  an average over datasets.
* **Cluster bootstrap** (``clusters=`` in :func:`evaluate` and :func:`paired_bootstrap`): when examples come in
  clusters (the snippets of one book, the windows of one text), whole clusters are resampled instead of examples
  (below); the point estimates are the same, only the intervals change.

Cluster bootstrap
-----------------
``clusters`` (one hashable key per example, e.g. the title of the book a snippet comes from): examples of one
cluster are not independent (a book's snippets share its style, its names, whether the model saw it), so resampling
examples as if they were treats 48 snippets of 12 books as 48 independent draws and gives intervals that are too
narrow. Each resample here draws whole clusters with replacement and keeps every example of a drawn cluster (as many
times as the cluster was drawn); the statistic is computed on that multiset. This is the usual cluster (block)
bootstrap of one-way clustered data: Field & Welsh (2007, *Bootstrapping clustered data*, JRSS B 69(3), 369-390;
read: its summary) find its variance estimates consistent both under a random-effect and under a transformation
model of such data (for means and sums of squares; an AUROC is not among the statistics they treat). With few
clusters the interval is wide, and it should be.

* When every cluster holds one label (a book is seen or unseen), the resample is **stratified**: the member clusters
  and the non-member clusters are drawn separately, each at its observed count of clusters, so every resample has
  both classes (the class balance of examples may vary with cluster sizes).
* When some cluster holds both labels, all clusters are drawn together (as many as there are); a resample with one
  class only has no AUROC and is **redrawn** (the interval is conditional on both classes, as the stratified ones
  are by construction); ``n_redrawn`` counts the redraws.

The point estimates are the same as without ``clusters``. Clusters with a NaN/inf score are kept with their other
examples (a cluster whose every score is NaN/inf is gone). With one example per cluster the draws are exactly those
of the plain stratified bootstrap (clusters numbered in order of first appearance), so the intervals are the same.

The comparisons live in :mod:`mia_jax.evaluation.comparisons`, the resampling they share with :func:`evaluate` in
:mod:`mia_jax.evaluation.bootstrap`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from jax.typing import ArrayLike

from mia_jax.evaluation.bootstrap import (FPR_TARGETS, MIN_PER_CLASS, TPR_KEYS, ClusterDraw, as_labels, as_scores,
                               cluster_bootstrap, cluster_ids, interval, stratified_bootstrap, too_few)
# re-exported for the callers that import them from here (train/, eval_report):
from mia_jax.evaluation.comparisons import (compare_to_best, describe, evaluate_mean, paired_bootstrap,  # noqa: F401
                                 subset_bootstrap, tied_with_best)


def _checked(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    """Validated (labels, scores) for the low-level functions: finite scores, both classes present."""
    lab = as_labels(labels)
    sc = as_scores(scores, lab.shape[0])
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
    from sklearn import metrics as skm  # here: scikit-learn takes ~0.8 s to import, off the CLI's start-up

    return skm.roc_curve(lab, sc, drop_intermediate=False)


def auroc(labels, scores) -> float:
    """Area under the ROC curve (Mann-Whitney U / (n_members * n_nonmembers), ties count 1/2)."""
    lab, sc = _checked(labels, scores)
    from sklearn import metrics as skm

    return float(skm.roc_auc_score(lab, sc))


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


def evaluate(labels: ArrayLike | Sequence[int], scores: ArrayLike | Sequence[float], *, n_bootstrap: int = 1000,
             seed: int = 0, confidence: float = 0.95, clusters: Sequence | None = None,
             min_per_class: int = MIN_PER_CLASS) -> dict:
    """All metrics for one method as a JSON-serialisable dict (see the module docstring).

    Fewer than ``min_per_class`` scored members or non-members: every metric ``None`` and ``note`` says why.

    NaN/inf scores are counted in ``n_nan`` and excluded (and mentioned in ``note``). With only one class
    among the scored rows every metric is ``None`` and ``note`` says why. ``auroc_ci`` and
    ``tpr_at_5pct_fpr_ci`` are stratified percentile-bootstrap intervals, identical for the same ``seed``;
    ``None`` when ``n_bootstrap == 0``.

    Args:
        labels: int [n], 1 = member, 0 = non-member.
        scores: float [n] one method's scores, higher = more likely a member (NaN/inf counted and excluded).
        n_bootstrap, seed: the resamples of the bootstrap intervals (0: none) and their seed.
        confidence: the intervals' level, in (0, 1) (else ValueError).
        clusters: one hashable key per example: a cluster bootstrap (the module docstring's *Cluster bootstrap*);
            the dict then also has ``clusters`` (how many among the scored examples), ``bootstrap: "cluster"``,
            ``cluster_stratified`` (True, False, or None with one class) and ``n_redrawn`` (resamples redrawn).
        min_per_class: the fewest scored members and non-members with metrics.

    Returns:
        {metric: value}: the counts ``n``, ``n_scored``, ``n_nan``, ``n_members``, ``n_nonmembers``; ``auroc``,
        ``auroc_ci``, the TPRs at each target FPR, ``tpr_at_5pct_fpr_ci``, ``fpr_at_95pct_tpr``,
        ``best_balanced_accuracy``, ``best_threshold`` (floats, [lo, hi] intervals, or None) and ``note`` (str or None).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    lab = as_labels(labels)
    sc = as_scores(scores, lab.shape[0])
    cid = None if clusters is None else cluster_ids(clusters, lab.shape[0])
    finite = np.isfinite(sc)
    lab, sc = lab[finite], sc[finite]
    cid = None if cid is None else cid[finite]
    n_nan = int((~finite).sum())
    n_pos = int(lab.sum())
    n_neg = int(lab.shape[0] - n_pos)
    out: dict = {
        "n": int(finite.shape[0]), "n_scored": int(lab.shape[0]), "n_nan": n_nan,
        "n_members": n_pos, "n_nonmembers": n_neg,
        "auroc": None, "auroc_ci": None,
        **{TPR_KEYS[f]: None for f in FPR_TARGETS},
        "tpr_at_5pct_fpr_ci": None, "fpr_at_95pct_tpr": None,
        "best_balanced_accuracy": None, "best_threshold": None, "note": None,
    }
    notes = []
    if n_nan:
        notes.append(f"{n_nan} NaN/inf score{'s' if n_nan != 1 else ''} excluded")
    if cid is not None:
        out.update(clusters=len(set(cid.tolist())), bootstrap="cluster", cluster_stratified=None, n_redrawn=0)
    if n_pos == 0 or n_neg == 0:
        notes.insert(0, f"AUROC undefined: only one class among scored examples "
                        f"({n_pos} members, {n_neg} non-members)")
        out["note"] = "; ".join(notes)
        return out
    if reason := too_few(n_pos, n_neg, min_per_class):
        out["note"] = "; ".join([reason, *notes])
        return out
    out["auroc"] = auroc(lab, sc)
    for f in FPR_TARGETS:
        out[TPR_KEYS[f]] = tpr_at_fpr(lab, sc, f)
    out["fpr_at_95pct_tpr"] = fpr_at_tpr(lab, sc, 0.95)
    out["best_balanced_accuracy"], out["best_threshold"] = best_balanced_accuracy(lab, sc)
    if cid is not None:
        draw = ClusterDraw(np.arange(lab.shape[0]), cid, lab)
        out["cluster_stratified"] = draw.stratified
    if n_bootstrap:
        if cid is None:
            aucs, tprs = stratified_bootstrap(sc[lab == 1], sc[lab == 0], n_bootstrap, seed, 0.05)
        else:
            boot_auc, boot_tpr, out["n_redrawn"] = cluster_bootstrap([sc], [draw], n_bootstrap, seed, 0.05)
            aucs, tprs = boot_auc[:, 0], boot_tpr[:, 0]
        out["auroc_ci"] = interval(aucs, confidence)
        out["tpr_at_5pct_fpr_ci"] = interval(tprs, confidence)
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

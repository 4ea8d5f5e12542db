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
  (see :func:`evaluate`); the point estimates are the same, only the intervals change.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn import metrics as _skm

FPR_TARGETS = (0.001, 0.01, 0.05)
_TPR_KEYS = {0.001: "tpr_at_0.1pct_fpr", 0.01: "tpr_at_1pct_fpr", 0.05: "tpr_at_5pct_fpr"}
_CHUNK_ELEMENTS = 4_000_000  # bootstrap resamples are processed in blocks of about this many values
MIN_PER_CLASS = 10  # fewer members or non-members than this: no metric (n/a with the reason), never a verdict


def too_few(n_pos: int, n_neg: int, minimum: int = MIN_PER_CLASS) -> str | None:
    """The reason a cell is n/a when a class has fewer than ``minimum`` examples (an AUROC of 3 members against 4
    non-members is 1.000 [1.000, 1.000] by chance far too often to print), else None."""
    if min(n_pos, n_neg) < minimum:
        return f"n/a: fewer than {minimum} examples per class ({n_pos} members, {n_neg} non-members)"
    return None


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


def evaluate(labels, scores, *, n_bootstrap: int = 1000, seed: int = 0, confidence: float = 0.95,
             clusters: Sequence | None = None, min_per_class: int = MIN_PER_CLASS) -> dict:
    """All metrics for one method as a JSON-serialisable dict (see the module docstring).

    Fewer than ``min_per_class`` scored members or non-members: every metric ``None`` and ``note`` says why.

    NaN/inf scores are counted in ``n_nan`` and excluded (and mentioned in ``note``). With only one class
    among the scored rows every metric is ``None`` and ``note`` says why. ``auroc_ci`` and
    ``tpr_at_5pct_fpr_ci`` are stratified percentile-bootstrap intervals, identical for the same ``seed``;
    ``None`` when ``n_bootstrap == 0``.

    ``clusters`` (one hashable key per example, e.g. the title of the book a snippet comes from): a **cluster
    bootstrap**. Examples of one cluster are not independent (a book's snippets share its style, its names, whether
    the model saw it), so resampling examples as if they were treats 48 snippets of 12 books as 48 independent
    draws and gives intervals that are too narrow. Each resample here draws whole clusters with replacement and
    keeps every example of a drawn cluster (as many times as the cluster was drawn); the statistic is computed on
    that multiset. This is the usual cluster (block) bootstrap of one-way clustered data: Field & Welsh (2007,
    *Bootstrapping clustered data*, JRSS B 69(3), 369-390; read: its summary) find its variance estimates consistent
    both under a random-effect and under a transformation model of such data (for means and sums of squares; an
    AUROC is not among the statistics they treat). With few clusters the interval is wide, and it should be.

    - When every cluster holds one label (a book is seen or unseen), the resample is **stratified**: the member
      clusters and the non-member clusters are drawn separately, each at its observed count of clusters, so every
      resample has both classes (the class balance of examples may vary with cluster sizes).
    - When some cluster holds both labels, all clusters are drawn together (as many as there are); a resample with
      one class only has no AUROC and is **redrawn** (the interval is conditional on both classes, as the
      stratified ones are by construction); ``n_redrawn`` counts the redraws.

    The point estimates are the same as without ``clusters``. Clusters with a NaN/inf score are kept with their
    other examples (a cluster whose every score is NaN/inf is gone). With ``clusters`` the dict also has
    ``clusters`` (how many among the scored examples), ``bootstrap: "cluster"``, ``cluster_stratified`` (True,
    False, or None with one class) and ``n_redrawn``. With one example per cluster the draws are exactly those of
    the plain stratified bootstrap (clusters numbered in order of first appearance), so the intervals are the
    same."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    lab = _as_labels(labels)
    sc = _as_scores(scores, lab.shape[0])
    cid = None if clusters is None else _cluster_ids(clusters, lab.shape[0])
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
        **{_TPR_KEYS[f]: None for f in FPR_TARGETS},
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
        out[_TPR_KEYS[f]] = tpr_at_fpr(lab, sc, f)
    out["fpr_at_95pct_tpr"] = fpr_at_tpr(lab, sc, 0.95)
    out["best_balanced_accuracy"], out["best_threshold"] = best_balanced_accuracy(lab, sc)
    if cid is not None:
        draw = _ClusterDraw(np.arange(lab.shape[0]), cid, lab)
        out["cluster_stratified"] = draw.stratified
    if n_bootstrap:
        if cid is None:
            aucs, tprs = _bootstrap(sc[lab == 1], sc[lab == 0], n_bootstrap, seed, 0.05)
        else:
            boot_auc, boot_tpr, out["n_redrawn"] = _cluster_bootstrap([sc], [draw], n_bootstrap, seed, 0.05)
            aucs, tprs = boot_auc[:, 0], boot_tpr[:, 0]
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


# ---------------------------------------------------------------- paired comparisons (vectorised, stratified)

VERDICTS = ("A > B", "B > A", "not distinguishable")


def _tpr_key(fpr: float) -> str:
    return _TPR_KEYS.get(fpr, f"tpr_at_{fpr:g}_fpr")


def _group_rows(lab: np.ndarray, groups, n: int) -> tuple[list, list[tuple[np.ndarray, np.ndarray]]]:
    """(group keys in order of first appearance, [(member rows, non-member rows)] per group); every group must
    hold both classes."""
    if groups is None:
        keys, key_of = [None], np.zeros(n, np.int64)
    else:
        g = list(groups)
        if len(g) != n:
            raise ValueError(f"groups and labels differ in length: {len(g)} groups, {n} labels")
        keys = list(dict.fromkeys(g))
        if not keys:
            raise ValueError("no example left (every score NaN/inf)")
        index = {k: i for i, k in enumerate(keys)}
        key_of = np.array([index[k] for k in g], np.int64)
    rows = []
    for i, k in enumerate(keys):
        pos = np.flatnonzero((key_of == i) & (lab == 1))
        neg = np.flatnonzero((key_of == i) & (lab == 0))
        if pos.size == 0 or neg.size == 0:
            where = "" if k is None else f" in group {k!r}"
            raise ValueError(f"need both classes{where}; got {pos.size} members and {neg.size} non-members")
        rows.append((pos, neg))
    return keys, rows


def _grouped_bootstrap(vectors: Sequence[np.ndarray], rows, n_bootstrap: int, seed: int, fpr: float):
    """Mean over groups of AUROC and TPR@``fpr`` of each score vector, on the data and on ``n_bootstrap`` stratified
    resamples that are **shared by all vectors** (paired): -> (auroc [V], tpr [V], boot_auroc [B, V], boot_tpr [B, V]).

    The draws, in order: per block of ``max(1, _CHUNK_ELEMENTS // (V * n))`` resamples, per group in order,
    ``rng.integers(0, P_g, (b, P_g))`` for its members, then ``rng.integers(0, N_g, (b, N_g))`` for its
    non-members (``rng = np.random.default_rng(seed)``)."""
    n_groups = len(rows)
    point_auc = np.zeros(len(vectors))
    point_tpr = np.zeros(len(vectors))
    for pos, neg in rows:
        for v, sc in enumerate(vectors):
            point_auc[v] += _auroc_rows(sc[pos][None], sc[neg][None])[0]
            point_tpr[v] += _tpr_at_fpr_rows(sc[pos][None], sc[neg][None], fpr)[0]
    n_total = sum(p.size + q.size for p, q in rows)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (len(vectors) * n_total))
    aucs, tprs = [], []
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        auc = np.zeros((b, len(vectors)))
        tpr = np.zeros((b, len(vectors)))
        for pos, neg in rows:
            ip = pos[rng.integers(0, pos.size, size=(b, pos.size))]
            iq = neg[rng.integers(0, neg.size, size=(b, neg.size))]
            for v, sc in enumerate(vectors):
                p, q = sc[ip], sc[iq]
                auc[:, v] += _auroc_rows(p, q)
                tpr[:, v] += _tpr_at_fpr_rows(p, q, fpr)
        aucs.append(auc / n_groups)
        tprs.append(tpr / n_groups)
    boot_auc = np.concatenate(aucs) if aucs else np.zeros((0, len(vectors)))
    boot_tpr = np.concatenate(tprs) if tprs else np.zeros((0, len(vectors)))
    return point_auc / n_groups, point_tpr / n_groups, boot_auc, boot_tpr


def verdict(ci) -> str:
    """"A > B" when the interval of A - B lies above 0, "B > A" when below, else "not distinguishable"."""
    lo, hi = ci
    return VERDICTS[0] if lo > 0 else VERDICTS[1] if hi < 0 else VERDICTS[2]


def _check_bootstrap_args(n_bootstrap: int, confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be >= 1 for an interval, got {n_bootstrap}")


def paired_bootstrap(labels, scores_a, scores_b, *, groups: Sequence | None = None, n_bootstrap: int = 1000,
                     seed: int = 0, confidence: float = 0.95, fpr: float = 0.05,
                     clusters: Sequence | None = None, min_per_class: int = MIN_PER_CLASS) -> dict:
    """Paired bootstrap of A - B for two score vectors on the **same** examples: two methods scored by one model,
    or one method scored by two models (e.g. two learning rates) on the same eval set.

    Examples are resampled, stratified by label (members and non-members separately, with replacement, at their
    observed counts, as :func:`evaluate`'s intervals), and each resample is applied to both A and B, so what the
    interval measures is the difference on the same examples. Per resample: AUROC(A) - AUROC(B) and
    TPR@``fpr``(A) - TPR@``fpr``(B). With ``groups`` (one key per example, e.g. its dataset) the statistic is the
    mean over groups of the per-group metric (a table's average column), resampled within each group.

    Rows where A or B is NaN/inf are dropped from both (counted in ``n_dropped``). Returns a JSON-serialisable
    dict: ``n, n_used, n_dropped, n_members, n_nonmembers, groups, n_bootstrap, seed, confidence`` and, for
    ``"auroc"`` and the TPR key (``"tpr_at_5pct_fpr"``), ``{"a", "b", "a_ci", "b_ci", "diff", "ci": [lo, hi],
    "verdict"}`` (``a_ci`` / ``b_ci``: each side's own interval from the same resamples) with
    ``verdict`` one of ``"A > B"``, ``"B > A"`` or ``"not distinguishable"`` (the interval contains 0).
    Deterministic for a given ``seed``; swapping A and B negates every difference and interval exactly.

    ``clusters`` (one key per example, e.g. a snippet's book): a cluster bootstrap (see :func:`evaluate`): whole
    clusters are resampled, stratified by label when every cluster holds one label, and each resample of clusters is
    applied to both A and B. With ``groups``, clusters are resampled within each group (a key found in two groups is
    two clusters), per group stratified or not on its own. The point estimates are those without ``clusters``; the
    dict also has ``clusters`` (their number, summed over groups), ``bootstrap: "cluster"``, ``cluster_stratified``
    (True when every group was stratified) and ``n_redrawn``."""
    _check_bootstrap_args(n_bootstrap, confidence)
    lab = _as_labels(labels)
    a = _as_scores(scores_a, lab.shape[0])
    b = _as_scores(scores_b, lab.shape[0])
    if groups is not None and len(groups) != lab.shape[0]:
        raise ValueError(f"groups and labels differ in length: {len(groups)} groups, {lab.shape[0]} labels")
    cid = None if clusters is None else _cluster_ids(clusters, lab.shape[0])
    keep = np.isfinite(a) & np.isfinite(b)
    kept_groups = None if groups is None else [g for g, k in zip(groups, keep) if k]
    lab, a, b = lab[keep], a[keep], b[keep]
    keys, rows = _group_rows(lab, kept_groups, lab.shape[0])
    _enough(rows, keys, min_per_class)
    if cid is None:
        auc, tpr, boot_auc, boot_tpr = _grouped_bootstrap([a, b], rows, n_bootstrap, seed, fpr)
    else:
        auc, tpr, _, _ = _grouped_bootstrap([a, b], rows, 0, seed, fpr)
        draws = [_ClusterDraw(np.sort(np.concatenate([pos, neg])), cid[keep], lab) for pos, neg in rows]
        boot_auc, boot_tpr, n_redrawn = _cluster_bootstrap([a, b], draws, n_bootstrap, seed, fpr)
    out = {"n": int(keep.shape[0]), "n_used": int(keep.sum()), "n_dropped": int((~keep).sum()),
           "n_members": int(lab.sum()), "n_nonmembers": int(lab.shape[0] - lab.sum()),
           "groups": None if groups is None else [str(k) for k in keys],
           "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    if cid is not None:
        out.update(clusters=sum(d.k for d in draws), bootstrap="cluster",
                   cluster_stratified=all(d.stratified for d in draws), n_redrawn=n_redrawn)
    for key, point, boot in (("auroc", auc, boot_auc), (_tpr_key(fpr), tpr, boot_tpr)):
        out[key] = _comparison(point[0], point[1], boot[:, 0], boot[:, 1], confidence)
    return out


def _enough(rows, keys, minimum: int = MIN_PER_CLASS) -> None:
    """ValueError naming the first group (or the whole set) with fewer than ``minimum`` examples of a class."""
    for key, (pos, neg) in zip(keys, rows):
        if reason := too_few(len(pos), len(neg), minimum):
            raise ValueError(reason if len(keys) == 1 else f"{key}: {reason}")


def _comparison(a: float, b: float, boot_a: np.ndarray, boot_b: np.ndarray, confidence: float) -> dict:
    """One metric of a paired comparison: the point estimates, each side's own interval (``a_ci``, ``b_ci``) and
    the interval of the paired difference, all from the same resamples."""
    ci = _interval(boot_a - boot_b, confidence)
    return {"a": float(a), "b": float(b), "a_ci": _interval(boot_a, confidence), "b_ci": _interval(boot_b, confidence),
            "diff": float(a - b), "ci": ci, "verdict": verdict(ci)}


# ---------------------------------------------------------------- cluster bootstrap (vectorised, weighted)

_MAX_REDRAW_ROUNDS = 1000  # a group with a mixed cluster has P(one-class resample) <= (1 - 1/K)^K < 1/e


def _cluster_ids(clusters, n: int) -> np.ndarray:
    """int64 [n]: each example's cluster, numbered in order of first appearance."""
    keys = list(clusters)
    if len(keys) != n:
        raise ValueError(f"clusters and labels differ in length: {len(keys)} clusters, {n} labels")
    index: dict = {}
    try:
        return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)
    except TypeError:
        raise ValueError("clusters must be hashable keys (e.g. a title or an id), one per example") from None


def _cluster_counts(draw: np.ndarray, k: int) -> np.ndarray:
    """Times each of ``k`` clusters is drawn in each row of ``draw`` [b, m] (values in [0, k)) -> float64 [b, k]."""
    b = draw.shape[0]
    flat = (draw + k * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * k).reshape(b, k).astype(np.float64)


class _ClusterDraw:
    """How one group's examples are resampled by cluster. ``rows`` [n_g]: the group's rows in the score vectors
    (ascending); its clusters are numbered 0..K-1 in order of first appearance among them. Stratified when no
    cluster holds both labels.

    Draws per call (``rng`` shared by the groups, in order): stratified, ``rng.integers(0, K1, (b, K1))`` over the
    member clusters, then ``rng.integers(0, K0, (b, K0))`` over the non-member clusters (each in order of first
    appearance); else ``rng.integers(0, K, (b, K))``, then for the resamples with one class only
    ``rng.integers(0, K, (r, K))`` again until none is left."""

    def __init__(self, rows: np.ndarray, cid: np.ndarray, lab: np.ndarray):
        self.rows = rows
        self.lab = lab[rows]
        self.local = _cluster_ids(cid[rows].tolist(), rows.size)
        self.k = int(self.local.max()) + 1 if rows.size else 0
        self.n_pos = np.bincount(self.local, weights=self.lab, minlength=self.k)
        self.n_neg = np.bincount(self.local, weights=1 - self.lab, minlength=self.k)
        self.stratified = not bool(((self.n_pos > 0) & (self.n_neg > 0)).any())
        self.pos_clusters = np.flatnonzero(self.n_pos > 0)
        self.neg_clusters = np.flatnonzero(self.n_neg > 0)

    def weights(self, rng, b: int) -> tuple[np.ndarray, int]:
        """(float64 [b, n_g]: how many times each example is in each of ``b`` resamples, resamples redrawn)."""
        if self.stratified:
            counts = np.zeros((b, self.k))
            for cl in (self.pos_clusters, self.neg_clusters):
                counts[:, cl] = _cluster_counts(rng.integers(0, cl.size, size=(b, cl.size)), cl.size)
            return counts[:, self.local], 0
        counts = _cluster_counts(rng.integers(0, self.k, size=(b, self.k)), self.k)
        redrawn = 0
        for _ in range(_MAX_REDRAW_ROUNDS):
            bad = np.flatnonzero((counts @ self.n_pos == 0) | (counts @ self.n_neg == 0))
            if not bad.size:
                return counts[:, self.local], redrawn
            redrawn += int(bad.size)
            counts[bad] = _cluster_counts(rng.integers(0, self.k, size=(bad.size, self.k)), self.k)
        raise RuntimeError("cluster bootstrap: resamples with one class kept coming back")  # P < e^-1000


def _weighted_rows(sc: np.ndarray, lab: np.ndarray, w: np.ndarray, fpr: float) -> tuple[np.ndarray, np.ndarray]:
    """AUROC and TPR@``fpr`` of each resample given as multiplicities ``w`` [B, n] of the examples (``sc``, ``lab``
    [n]): the same values as :func:`_auroc_rows` / :func:`_tpr_at_fpr_rows` on the resampled rows, exactly (integer
    counts, one division each), without materialising rows of unequal length."""
    order = np.argsort(sc, kind="stable")
    s = sc[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # runs of equal scores, ascending
    w = w[:, order]
    member = lab[order] == 1
    pos = np.add.reduceat(np.where(member, w, 0.0), starts, axis=1)  # [B, m]: member weight at each distinct score
    neg = np.add.reduceat(np.where(member, 0.0, w), starts, axis=1)
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    neg_below = np.cumsum(neg, axis=1) - neg
    auc = (pos * (neg_below + 0.5 * neg)).sum(axis=1) / (n_pos * n_neg)
    # k: the largest count with k / n_neg <= fpr (the float comparison of _max_false_positives)
    k = np.floor(fpr * n_neg)
    k = np.where((k + 1) / n_neg <= fpr, k + 1, k)
    k = np.where(k / n_neg > fpr, k - 1, k)
    neg_at_or_above = n_neg[:, None] - neg_below  # non-increasing along the scores
    v = (neg_at_or_above >= k[:, None] + 1).sum(axis=1) - 1  # the (k+1)-th largest non-member score's run
    pos_upto = np.cumsum(pos, axis=1)
    above = n_pos - np.take_along_axis(pos_upto, np.maximum(v, 0)[:, None], axis=1)[:, 0]
    tpr = np.where(k >= n_neg, 1.0, above / n_pos)
    return auc, tpr


def _cluster_bootstrap(vectors: Sequence[np.ndarray], draws: Sequence[_ClusterDraw], n_bootstrap: int, seed: int,
                       fpr: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean over groups (``draws``, one per group) of AUROC and TPR@``fpr`` of each score vector on ``n_bootstrap``
    cluster resamples shared by all vectors: -> (boot_auroc [B, V], boot_tpr [B, V], resamples redrawn). Blocks of
    ``max(1, _CHUNK_ELEMENTS // (V * n))`` resamples, as :func:`_grouped_bootstrap`."""
    n_total = sum(d.rows.size for d in draws)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (len(vectors) * n_total))
    aucs, tprs, redrawn = [], [], 0
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        auc = np.zeros((b, len(vectors)))
        tpr = np.zeros((b, len(vectors)))
        for d in draws:
            w, r = d.weights(rng, b)
            redrawn += r
            for v, sc in enumerate(vectors):
                x, y = _weighted_rows(sc[d.rows], d.lab, w, fpr)
                auc[:, v] += x
                tpr[:, v] += y
        aucs.append(auc / len(draws))
        tprs.append(tpr / len(draws))
    empty = np.zeros((0, len(vectors)))
    return (np.concatenate(aucs) if aucs else empty, np.concatenate(tprs) if tprs else empty, redrawn)


def evaluate_mean(labels, scores, groups: Sequence, *, n_bootstrap: int = 1000, seed: int = 0,
                  confidence: float = 0.95, min_per_class: int = MIN_PER_CLASS) -> dict:
    """The mean over ``groups`` (e.g. datasets) of one method's per-group AUROC and TPR@5%FPR, with stratified
    percentile-bootstrap intervals (resampled within each group, members and non-members separately; the same
    draws as :func:`paired_bootstrap` with the same ``seed``). NaN/inf scores are excluded (``n_nan``).

    ``scores`` may also be several score vectors on the **same** examples, shape ``[V, n]`` (e.g. one method
    under two models on the same texts): the statistic is then the mean over vectors and groups, and every
    resample is shared by all vectors, so the interval of a table's "average over models" column accounts for
    the vectors being scored on the same texts. An example whose score is NaN/inf in any vector is dropped from all.
    ``{"auroc", "auroc_ci", "tpr_at_5pct_fpr", "tpr_at_5pct_fpr_ci", "n_groups", "n_nan"}``; intervals ``None``
    when ``n_bootstrap == 0``."""
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    lab = _as_labels(labels)
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != lab.shape[0]):
        raise ValueError(f"scores must have shape [n] or [V, n] with n = {lab.shape[0]} labels, got {arr.shape}")
    vectors = [_as_scores(v, lab.shape[0]) for v in np.atleast_2d(arr)]
    keep = np.logical_and.reduce([np.isfinite(v) for v in vectors])
    keys, rows = _group_rows(lab[keep], [g for g, k in zip(groups, keep) if k], int(keep.sum()))
    try:
        _enough(rows, keys, min_per_class)
    except ValueError as e:
        return {"auroc": None, "auroc_ci": None, "tpr_at_5pct_fpr": None, "tpr_at_5pct_fpr_ci": None,
                "n_groups": len(keys), "n_nan": int((~keep).sum()), "note": str(e)}
    auc, tpr, boot_auc, boot_tpr = _grouped_bootstrap([v[keep] for v in vectors], rows, n_bootstrap, seed, 0.05)
    return {"auroc": float(auc.mean()),
            "auroc_ci": _interval(boot_auc.mean(axis=1), confidence) if n_bootstrap else None,
            "tpr_at_5pct_fpr": float(tpr.mean()),
            "tpr_at_5pct_fpr_ci": _interval(boot_tpr.mean(axis=1), confidence) if n_bootstrap else None,
            "n_groups": len(keys), "n_nan": int((~keep).sum())}


def subset_bootstrap(scores, labels, members_a, members_b, *, n_bootstrap: int = 1000, seed: int = 0,
                     confidence: float = 0.95, fpr: float = 0.05, min_per_class: int = MIN_PER_CLASS) -> dict:
    """AUROC / TPR@``fpr`` of two member subsets against the **same** non-members (e.g. members inserted k = 4
    times vs k = 1 times): the non-members are resampled once per resample and shared by A and B (paired), each
    member subset resampled on its own. ``members_a`` / ``members_b`` are boolean masks over the examples (members
    only). Returns the same layout as :func:`paired_bootstrap` (``a`` = subset A vs the non-members).
    Draws: per block, non-members first, then subset A's members, then subset B's."""
    _check_bootstrap_args(n_bootstrap, confidence)
    lab = _as_labels(labels)
    sc = _as_scores(scores, lab.shape[0])
    ma, mb = np.asarray(members_a, bool), np.asarray(members_b, bool)
    fin = np.isfinite(sc)
    if ((ma | mb) & (lab == 0)).any():
        raise ValueError("members_a / members_b must select members (label 1) only")
    neg, pa, pb = sc[(lab == 0) & fin], sc[ma & fin], sc[mb & fin]
    if min(neg.size, pa.size, pb.size) == 0:
        raise ValueError(f"need non-members and members in both subsets; got {neg.size}, {pa.size}, {pb.size}")
    if reason := too_few(min(pa.size, pb.size), neg.size, min_per_class):
        raise ValueError(reason)
    point = [(_auroc_rows(p[None], neg[None])[0], _tpr_at_fpr_rows(p[None], neg[None], fpr)[0]) for p in (pa, pb)]
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (2 * (neg.size + pa.size + pb.size)))
    boot: dict[str, list] = {"auroc": [], "tpr": []}  # per block: [resamples, 2] (subset A, subset B)
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        q = neg[rng.integers(0, neg.size, size=(b, neg.size))]
        p1 = pa[rng.integers(0, pa.size, size=(b, pa.size))]
        p2 = pb[rng.integers(0, pb.size, size=(b, pb.size))]
        boot["auroc"].append(np.stack([_auroc_rows(p1, q), _auroc_rows(p2, q)], axis=1))
        boot["tpr"].append(np.stack([_tpr_at_fpr_rows(p1, q, fpr), _tpr_at_fpr_rows(p2, q, fpr)], axis=1))
    out = {"n": int(lab.shape[0]), "n_used": int(neg.size + pa.size + pb.size), "n_dropped": int((~fin).sum()),
           "n_members": [int(pa.size), int(pb.size)], "n_nonmembers": int(neg.size), "groups": None,
           "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    for j, (key, blocks) in enumerate((("auroc", boot["auroc"]), (_tpr_key(fpr), boot["tpr"]))):
        draws = np.concatenate(blocks) if blocks else np.zeros((0, 2))
        out[key] = _comparison(point[0][j], point[1][j], draws[:, 0], draws[:, 1], confidence)
    return out


def describe(comparison: dict, name_a: str, name_b: str, key: str = "auroc", label: str = "AUROC") -> str:
    """One sentence for a report: ``"min_k > ppl: AUROC 0.712 vs 0.655, difference +0.057 [95% CI +0.012,
    +0.101]"``; ``"min_k vs ppl: not distinguishable (AUROC ...)"`` when the interval contains 0."""
    c = comparison[key]
    pct = f"{comparison['confidence']:.0%}"
    detail = (f"{label} {c['a']:.3f} vs {c['b']:.3f}, difference {c['diff']:+.3f} "
              f"[{pct} CI {c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}], paired bootstrap")
    if c["verdict"] == VERDICTS[0]:
        return f"{name_a} > {name_b}: {detail}"
    if c["verdict"] == VERDICTS[1]:
        return f"{name_b} > {name_a}: {detail}"
    return f"{name_a} vs {name_b}: not distinguishable ({detail})"


def compare_to_best(labels, scores: dict, points: dict, *, key: str = "auroc", groups: Sequence | None = None,
                    n_bootstrap: int = 1000, seed: int = 0) -> dict:
    """The best method of a table column and its paired comparison with each other method: ``points`` {method:
    the column's value of ``key``, or None}, ``scores`` {method: score vector on the same examples}. The best is the
    largest point estimate; each other method gets :func:`paired_bootstrap` (best as A, ``groups`` as there), or
    None where that fails (a class left empty). ``{"best": method, "vs": {method: comparison or None}}``, or None
    when no method has a value. :func:`tied_with_best` reads the methods a report may bold."""
    point = {m: v for m, v in points.items() if v is not None}
    if not point:
        return None
    best = max(point, key=lambda m: point[m])
    vs = {}
    for m in point:
        if m != best:
            try:
                vs[m] = paired_bootstrap(labels, scores[best], scores[m], groups=groups, n_bootstrap=n_bootstrap,
                                         seed=seed)
            except ValueError:
                vs[m] = None
    return {"best": best, "vs": vs}


def tied_with_best(entry: dict | None, key: str = "auroc") -> set:
    """The methods of a :func:`compare_to_best` entry that a report bolds: the best and every method the paired
    bootstrap does not place below it (interval of best - method containing 0, or no comparison possible)."""
    if entry is None:
        return set()
    return {entry["best"]} | {m for m, c in entry["vs"].items() if c is None or c[key]["verdict"] != VERDICTS[0]}

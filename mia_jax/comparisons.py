"""Comparisons of detectors with paired bootstrap intervals (the conventions are :mod:`mia_jax.metrics`'s):
two score vectors on the same examples (:func:`paired_bootstrap`), two member subsets against shared non-members
(:func:`subset_bootstrap`), the mean over groups of one method (:func:`evaluate_mean`), the best method of a
table column and those tied with it (:func:`compare_to_best`, :func:`tied_with_best`), the family-wise correction of
a table's verdicts (:func:`holm_adjust`), and the sentence a report prints (:func:`describe`).

**Verdicts and multiplicity.** A verdict ("A > B", a bold cell, "best method") is stated from at least
``VERDICT_RESAMPLES`` (2000) paired resamples (the table writers pass :func:`verdict_resamples` of their configured
count; with 200 or 1000, a verdict at the edge of its interval flips with the seed). Each comparison carries the
two-sided bootstrap p-value of its difference, ``p = min(1, 2 min(#{d* <= 0}, #{d* >= 0}) / B)`` over the B resampled
differences d* (:func:`bootstrap_p`: the smallest level at which the two-sided percentile interval excludes 0, the
"achieved significance level" of Efron & Tibshirani, ch. 16, read off the paired resamples). :func:`holm_adjust`
corrects the comparisons of one table together with **Holm's step-down method on these p-values** (Holm 1979; the
adjusted p-values are those of ``statsmodels.stats.multitest.multipletests(p, method="holm")``: sorted ascending,
``min(1, max_{j <= i} (m - j + 1) p_(j))``; scipy has no Holm, so :func:`holm` computes it): a verdict is stated
when its adjusted p is below ``alpha = 1 - confidence`` (strictly, so that every stated verdict also has an
unadjusted interval that excludes 0), and the report prints the **unadjusted** interval with the adjusted p beside
it. Holm-adjusted interval levels were not used: a comparison's interval would then depend on its rank in the
family, and a reader could no longer compare two rows' intervals."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from mia_jax import bootstrap, verdict_log
from mia_jax.bootstrap import (MIN_PER_CLASS, ClusterDraw, as_labels, as_scores, auroc_rows, cluster_bootstrap,
                               cluster_ids, drawn_rows, group_rows, grouped_bootstrap, interval, too_few,
                               tpr_at_fpr_rows, tpr_key)
from mia_jax.rounding import fmt

VERDICTS = ("A > B", "B > A", "not distinguishable")
VERDICT_RESAMPLES = 2000  # the fewest paired resamples behind any stated verdict
OTHER_SEEDS = 5  # a study reports how many of its verdicts keep their direction under this many other seeds


def verdict_resamples(n_bootstrap: int) -> int:
    """The resamples of a comparison behind a verdict: ``n_bootstrap`` (a run's configured count), at least
    ``VERDICT_RESAMPLES``."""
    return max(int(n_bootstrap), VERDICT_RESAMPLES)


def bootstrap_p(boot_diff: np.ndarray) -> float:
    """Two-sided p-value of a paired difference from its B resampled values: ``min(1, 2 min(#{d <= 0}, #{d >= 0}) /
    B)`` (module docstring); 1.0 when B = 0 or every resample is 0 (two rank-identical methods)."""
    d = np.asarray(boot_diff, dtype=np.float64)
    if d.size == 0:
        return 1.0
    return float(min(1.0, 2.0 * min(np.count_nonzero(d <= 0), np.count_nonzero(d >= 0)) / d.size))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (float64, in the input order): sorted ascending, p_(i) times (m - i + 1),
    running maximum, capped at 1 (``multipletests(p, method="holm")[1]`` of statsmodels)."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.size == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1)))
    out = np.empty_like(adj)
    out[order] = adj
    return out


def holm_adjust(comparisons: Sequence, key: str = "auroc", alpha: float | None = None) -> int:
    """Holm's correction over ``comparisons`` (one table's family: :func:`paired_bootstrap` /
    :func:`subset_bootstrap` results; None entries, the n/a ones, are skipped), in place on each one's ``key``
    metric: ``p_holm`` (the adjusted p), ``family`` (m), ``verdict_unadjusted`` (the interval's own verdict) and
    ``verdict``, now the interval's direction when ``p_holm < alpha`` (default 1 - the comparison's confidence) and
    "not distinguishable" otherwise. Applying it again to the same family gives the same result. Returns m."""
    family = [c for c in comparisons if c is not None]
    if not family:
        return 0
    verdict_log.family(key, alpha, family)
    adjusted = holm([c[key]["p"] for c in family])
    for c, p_adj in zip(family, adjusted):
        m = c[key]
        level = (1.0 - c["confidence"]) if alpha is None else alpha
        m["verdict_unadjusted"] = m.get("verdict_unadjusted", m["verdict"])
        m.update(p_holm=float(p_adj), family=len(family),
                 verdict=m["verdict_unadjusted"] if p_adj < level else VERDICTS[2])
    return len(family)


def verdict(ci) -> str:
    """"A > B" when the interval of A - B lies above 0, "B > A" when below, else "not distinguishable"."""
    lo, hi = ci
    return VERDICTS[0] if lo > 0 else VERDICTS[1] if hi < 0 else VERDICTS[2]


def family_note(m: int, what: str = "comparisons") -> str:
    """The line under a table that states its correction: ``m`` paired comparisons (``what``) behind its verdicts,
    each from at least ``VERDICT_RESAMPLES`` resamples, Holm-corrected together."""
    if not m:
        return "No verdict in this table rests on a paired comparison."
    return (f"Multiplicity: the {m} paired comparisons behind this table's verdicts ({what}; at least "
            f"{VERDICT_RESAMPLES} resamples each) are corrected together by Holm's method on their paired-bootstrap "
            "p-values: a verdict is stated only where the adjusted p is below 0.05; the intervals shown are the "
            "unadjusted 95% ones.")


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
    observed counts, as :func:`metrics.evaluate`'s intervals), and each resample is applied to both A and B, so what the
    interval measures is the difference on the same examples. Per resample: AUROC(A) - AUROC(B) and
    TPR@``fpr``(A) - TPR@``fpr``(B). With ``groups`` (one key per example, e.g. its dataset) the statistic is the
    mean over groups of the per-group metric (a table's average column), resampled within each group.

    Rows where A or B is NaN/inf are dropped from both (counted in ``n_dropped``). Returns a JSON-serialisable
    dict: ``n, n_used, n_dropped, n_members, n_nonmembers, groups, n_bootstrap, seed, confidence`` and, for
    ``"auroc"`` and the TPR key (``"tpr_at_5pct_fpr"``), ``{"a", "b", "a_ci", "b_ci", "diff", "ci": [lo, hi],
    "verdict"}`` (``a_ci`` / ``b_ci``: each side's own interval from the same resamples) with
    ``verdict`` one of ``"A > B"``, ``"B > A"`` or ``"not distinguishable"`` (the interval contains 0).
    Deterministic for a given ``seed``; swapping A and B negates every difference and interval exactly.

    ``clusters`` (one key per example, e.g. a snippet's book): a cluster bootstrap (see :func:`metrics.evaluate`): whole
    clusters are resampled, stratified by label when every cluster holds one label, and each resample of clusters is
    applied to both A and B. With ``groups``, clusters are resampled within each group (a key found in two groups is
    two clusters), per group stratified or not on its own. The point estimates are those without ``clusters``; the
    dict also has ``clusters`` (their number, summed over groups), ``bootstrap: "cluster"``, ``cluster_stratified``
    (True when every group was stratified) and ``n_redrawn``."""
    _check_bootstrap_args(n_bootstrap, confidence)
    lab = as_labels(labels)
    a = as_scores(scores_a, lab.shape[0])
    b = as_scores(scores_b, lab.shape[0])
    if groups is not None and len(groups) != lab.shape[0]:
        raise ValueError(f"groups and labels differ in length: {len(groups)} groups, {lab.shape[0]} labels")
    cid = None if clusters is None else cluster_ids(clusters, lab.shape[0])
    keep = np.isfinite(a) & np.isfinite(b)
    kept_groups = None if groups is None else [g for g, k in zip(groups, keep) if k]
    lab, a, b = lab[keep], a[keep], b[keep]
    keys, rows = group_rows(lab, kept_groups, lab.shape[0])
    _enough(rows, keys, min_per_class)
    if cid is None:
        auc, tpr, boot_auc, boot_tpr = grouped_bootstrap([a, b], rows, n_bootstrap, seed, fpr)
    else:
        auc, tpr, _, _ = grouped_bootstrap([a, b], rows, 0, seed, fpr)
        draws = [ClusterDraw(np.sort(np.concatenate([pos, neg])), cid[keep], lab) for pos, neg in rows]
        boot_auc, boot_tpr, n_redrawn = cluster_bootstrap([a, b], draws, n_bootstrap, seed, fpr)
    out = {"n": int(keep.shape[0]), "n_used": int(keep.sum()), "n_dropped": int((~keep).sum()),
           "n_members": int(lab.sum()), "n_nonmembers": int(lab.shape[0] - lab.sum()),
           "groups": None if groups is None else [str(k) for k in keys],
           "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    if cid is not None:
        out.update(clusters=sum(d.k for d in draws), bootstrap="cluster",
                   cluster_stratified=all(d.stratified for d in draws), n_redrawn=n_redrawn)
    for key, point, boot in (("auroc", auc, boot_auc), (tpr_key(fpr), tpr, boot_tpr)):
        out[key] = _comparison(point[0], point[1], boot[:, 0], boot[:, 1], confidence)
    if verdict_log.active():
        verdict_log.record(out, lambda k: paired_bootstrap(
            labels, scores_a, scores_b, groups=groups, n_bootstrap=n_bootstrap, seed=seed + k, confidence=confidence,
            fpr=fpr, clusters=clusters, min_per_class=min_per_class))
    return out


def _enough(rows, keys, minimum: int = MIN_PER_CLASS) -> None:
    """ValueError naming the first group (or the whole set) with fewer than ``minimum`` examples of a class."""
    for key, (pos, neg) in zip(keys, rows):
        if reason := too_few(len(pos), len(neg), minimum):
            raise ValueError(reason if len(keys) == 1 else f"{key}: {reason}")


def _comparison(a: float, b: float, boot_a: np.ndarray, boot_b: np.ndarray, confidence: float) -> dict:
    """One metric of a paired comparison: the point estimates, each side's own interval (``a_ci``, ``b_ci``) and
    the interval of the paired difference, all from the same resamples."""
    ci = interval(boot_a - boot_b, confidence)
    return {"a": float(a), "b": float(b), "a_ci": interval(boot_a, confidence), "b_ci": interval(boot_b, confidence),
            "diff": float(a - b), "ci": ci, "verdict": verdict(ci), "p": bootstrap_p(boot_a - boot_b)}



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
    lab = as_labels(labels)
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != lab.shape[0]):
        raise ValueError(f"scores must have shape [n] or [V, n] with n = {lab.shape[0]} labels, got {arr.shape}")
    vectors = [as_scores(v, lab.shape[0]) for v in np.atleast_2d(arr)]
    keep = np.logical_and.reduce([np.isfinite(v) for v in vectors])
    keys, rows = group_rows(lab[keep], [g for g, k in zip(groups, keep) if k], int(keep.sum()))
    try:
        _enough(rows, keys, min_per_class)
    except ValueError as e:
        return {"auroc": None, "auroc_ci": None, "tpr_at_5pct_fpr": None, "tpr_at_5pct_fpr_ci": None,
                "n_groups": len(keys), "n_nan": int((~keep).sum()), "note": str(e)}
    auc, tpr, boot_auc, boot_tpr = grouped_bootstrap([v[keep] for v in vectors], rows, n_bootstrap, seed, 0.05)
    return {"auroc": float(auc.mean()),
            "auroc_ci": interval(boot_auc.mean(axis=1), confidence) if n_bootstrap else None,
            "tpr_at_5pct_fpr": float(tpr.mean()),
            "tpr_at_5pct_fpr_ci": interval(boot_tpr.mean(axis=1), confidence) if n_bootstrap else None,
            "n_groups": len(keys), "n_nan": int((~keep).sum())}


def subset_bootstrap(scores, labels, members_a, members_b, *, n_bootstrap: int = 1000, seed: int = 0,
                     confidence: float = 0.95, fpr: float = 0.05, min_per_class: int = MIN_PER_CLASS) -> dict:
    """AUROC / TPR@``fpr`` of two member subsets against the **same** non-members (e.g. members inserted k = 4
    times vs k = 1 times): the non-members are resampled once per resample and shared by A and B (paired), each
    member subset resampled on its own. ``members_a`` / ``members_b`` are boolean masks over the examples (members
    only). Returns the same layout as :func:`paired_bootstrap` (``a`` = subset A vs the non-members).
    Draws: per block, non-members first, then subset A's members, then subset B's."""
    _check_bootstrap_args(n_bootstrap, confidence)
    lab = as_labels(labels)
    sc = as_scores(scores, lab.shape[0])
    ma, mb = np.asarray(members_a, bool), np.asarray(members_b, bool)
    fin = np.isfinite(sc)
    if ((ma | mb) & (lab == 0)).any():
        raise ValueError("members_a / members_b must select members (label 1) only")
    neg, pa, pb = sc[(lab == 0) & fin], sc[ma & fin], sc[mb & fin]
    if min(neg.size, pa.size, pb.size) == 0:
        raise ValueError(f"need non-members and members in both subsets; got {neg.size}, {pa.size}, {pb.size}")
    if reason := too_few(min(pa.size, pb.size), neg.size, min_per_class):
        raise ValueError(reason)
    point = [(auroc_rows(p[None], neg[None])[0], tpr_at_fpr_rows(p[None], neg[None], fpr)[0]) for p in (pa, pb)]
    rng = np.random.default_rng(seed)
    chunk = max(1, bootstrap.CHUNK_ELEMENTS // (2 * (neg.size + pa.size + pb.size)))
    boot: dict[str, list] = {"auroc": [], "tpr": []}  # per block: [resamples, 2] (subset A, subset B)
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        iq = rng.integers(0, neg.size, size=(b, neg.size))
        (a1, t1), (a2, t2) = (drawn_rows(p, neg, rng.integers(0, p.size, size=(b, p.size)), iq, fpr) for p in (pa, pb))
        boot["auroc"].append(np.stack([a1, a2], axis=1))
        boot["tpr"].append(np.stack([t1, t2], axis=1))
    out = {"n": int(lab.shape[0]), "n_used": int(neg.size + pa.size + pb.size), "n_dropped": int((~fin).sum()),
           "n_members": [int(pa.size), int(pb.size)], "n_nonmembers": int(neg.size), "groups": None,
           "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    for j, (key, blocks) in enumerate((("auroc", boot["auroc"]), (tpr_key(fpr), boot["tpr"]))):
        draws = np.concatenate(blocks) if blocks else np.zeros((0, 2))
        out[key] = _comparison(point[0][j], point[1][j], draws[:, 0], draws[:, 1], confidence)
    if verdict_log.active():
        verdict_log.record(out, lambda k: subset_bootstrap(
            scores, labels, members_a, members_b, n_bootstrap=n_bootstrap, seed=seed + k, confidence=confidence,
            fpr=fpr, min_per_class=min_per_class))
    return out


def describe(comparison: dict, name_a: str, name_b: str, key: str = "auroc", label: str = "AUROC") -> str:
    """One sentence for a report: ``"min_k > ppl: AUROC 0.712 vs 0.655, difference +0.057 [95% CI +0.012,
    +0.101], paired bootstrap"``; ``"min_k vs ppl: not distinguishable (AUROC ...)"`` when the verdict is; after
    :func:`holm_adjust`, the adjusted p and the family's size follow the (unadjusted) interval."""
    c = comparison[key]
    pct = f"{comparison['confidence']:.0%}"
    detail = (f"{label} {fmt(c['a'])} vs {fmt(c['b'])}, difference {fmt(c['diff'], sign=True)} "
              f"[{pct} CI {fmt(c['ci'][0], sign=True)}, {fmt(c['ci'][1], sign=True)}], paired bootstrap")
    if "p_holm" in c:
        detail += f" ({comparison['n_bootstrap']} resamples), Holm-adjusted p {fmt(c['p_holm'])} of {c['family']}"
    if c["verdict"] == VERDICTS[0]:
        return f"{name_a} > {name_b}: {detail}"
    if c["verdict"] == VERDICTS[1]:
        return f"{name_b} > {name_a}: {detail}"
    return f"{name_a} vs {name_b}: not distinguishable ({detail})"


def _paired_with(labels, scores: dict, best: str, others: list, groups, n_bootstrap: int, seed: int) -> dict:
    """{method: paired_bootstrap(best, method) or None} for every method of ``others``, with one bootstrap of all
    the vectors when no score is NaN/inf (the same resamples, hence the same dicts, as the pairwise calls: blocks
    sized for two vectors), else one call per method."""
    lab = as_labels(labels)
    vecs = [as_scores(scores[m], lab.shape[0]) for m in (best, *others)]
    if not others or not all(np.isfinite(v).all() for v in vecs):
        return {m: _try_paired(labels, scores[best], scores[m], groups, n_bootstrap, seed) for m in others}
    if groups is not None and len(groups) != lab.shape[0]:
        raise ValueError(f"groups and labels differ in length: {len(groups)} groups, {lab.shape[0]} labels")
    keys, rows = group_rows(lab, None if groups is None else list(groups), lab.shape[0])
    try:
        _check_bootstrap_args(n_bootstrap, 0.95)
        _enough(rows, keys)
    except ValueError:
        return {m: None for m in others}
    auc, tpr, boot_auc, boot_tpr = grouped_bootstrap(vecs, rows, n_bootstrap, seed, 0.05, block_vectors=2)
    head = {"n": int(lab.shape[0]), "n_used": int(lab.shape[0]), "n_dropped": 0, "n_members": int(lab.sum()),
            "n_nonmembers": int(lab.shape[0] - lab.sum()), "groups": None if groups is None else [str(k) for k in keys],
            "n_bootstrap": n_bootstrap, "seed": seed, "confidence": 0.95}
    return {m: dict(head, **{k: _comparison(pt[0], pt[v], bt[:, 0], bt[:, v], 0.95)
                             for k, pt, bt in (("auroc", auc, boot_auc), (tpr_key(0.05), tpr, boot_tpr))})
            for v, m in enumerate(others, start=1)}


def _try_paired(labels, a, b, groups, n_bootstrap: int, seed: int) -> dict | None:
    try:
        return paired_bootstrap(labels, a, b, groups=groups, n_bootstrap=n_bootstrap, seed=seed)
    except ValueError:  # a class left empty once NaN rows are dropped
        return None


def compare_to_best(labels, scores: dict, points: dict, *, key: str = "auroc", groups: Sequence | None = None,
                    n_bootstrap: int = 1000, seed: int = 0) -> dict:
    """The best method of a table column and its paired comparison with each other method: ``points`` {method:
    the column's value of ``key``, or None}, ``scores`` {method: score vector on the same examples}. The best is the
    largest point estimate; each other method gets :func:`paired_bootstrap` (best as A, ``groups`` as there), or
    None where that fails (a class left empty). ``{"best": method, "vs": {method: comparison or None}}``, or None
    when no method has a value. :func:`tied_with_best` reads the methods a report may bold. Without NaN scores the
    methods share one bootstrap (vectorised; the same numbers as the pairwise calls)."""
    point = {m: v for m, v in points.items() if v is not None}
    if not point:
        return None
    best = max(point, key=lambda m: point[m])
    others = [m for m in point if m != best]
    vs = _paired_with(labels, scores, best, others, groups, n_bootstrap, seed)
    if verdict_log.active():  # the column recomputed once per seed offset, for all its comparisons
        again = functools.lru_cache(maxsize=None)(
            lambda k: _paired_with(labels, scores, best, others, groups, n_bootstrap, seed + k))
        for m, c in vs.items():
            if c is not None:
                verdict_log.record(c, lambda k, m=m: again(k)[m])
    return {"best": best, "vs": vs}


def runner_up(entry: dict | None, key: str = "auroc") -> tuple[str, dict] | None:
    """(method, comparison) of the runner-up of a :func:`compare_to_best` entry: the method with the highest point
    estimate below the best's that is **not rank-identical** to the best (a comparison whose every resampled
    difference is 0, e.g. Loss and PPL, which order every text alike, is no runner-up: it is the best again under
    another name); None when every other method is rank-identical or has no comparison."""
    if entry is None:
        return None
    ranked = sorted(((c[key]["diff"], m, c) for m, c in entry["vs"].items()
                     if c is not None and not _rank_identical(c[key])), key=lambda t: t[0])
    return (ranked[0][1], ranked[0][2]) if ranked else None


def _rank_identical(c: dict) -> bool:
    return c["diff"] == 0 and c["ci"][0] == 0 and c["ci"][1] == 0


def tied_with_best(entry: dict | None, key: str = "auroc") -> set:
    """The methods of a :func:`compare_to_best` entry that a report bolds: the best and every method the paired
    bootstrap does not place below it (interval of best - method containing 0, or no comparison possible)."""
    if entry is None:
        return set()
    return {entry["best"]} | {m for m, c in entry["vs"].items() if c is None or c[key]["verdict"] != VERDICTS[0]}

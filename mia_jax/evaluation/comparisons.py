"""Comparisons of detectors with paired bootstrap intervals (the conventions are :mod:`mia_jax.evaluation.metrics`'s):
two score vectors on the same examples (:func:`paired_bootstrap`), two member subsets against shared non-members
(:func:`subset_bootstrap`), the mean over groups of one method (:func:`evaluate_mean`, from
:mod:`mia_jax.evaluation.group_metrics`), the best method of a table column and those tied with it
(:func:`compare_to_best`, :func:`tied_with_best`), the family-wise correction of a table's verdicts
(:func:`holm_adjust`), and the sentence a report prints (:func:`describe`).

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
family, and a reader could no longer compare two rows' intervals.

**Verdicts that do not depend on the seed.** p carries a Monte-Carlo interval (:mod:`mia_jax.evaluation.pvalue`); Holm's
adjusted p is monotone in every p, so Holm's correction of the lower ends and of the upper ends bound the adjusted
p. Where those bounds straddle the threshold, :func:`holm_adjust` recomputes the comparison with more resamples
(:class:`Comparison`) and corrects again, until every verdict is decided or "undecided" at ``pvalue.MAX_RESAMPLES``;
the comparisons far from the threshold keep their first resamples."""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Callable, Sequence

import numpy as np

from mia_jax.evaluation import bootstrap, pvalue, verdict_log
from mia_jax.evaluation.bootstrap import (MIN_PER_CLASS, ClusterDraw, Ranked, as_labels, as_scores, auroc_rows,
                                          cluster_bootstrap, cluster_ids, group_rows, grouped_bootstrap, interval,
                                          resample_counts, too_few, tpr_at_fpr_rows, tpr_key)
from mia_jax.evaluation.group_metrics import enough_per_class, evaluate_mean  # noqa: F401 (evaluate_mean: re-exported)
from mia_jax.evaluation.rounding import fmt

VERDICTS = ("A > B", "B > A", "not distinguishable", "undecided")  # undecided: see holm_adjust
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


class Comparison(dict):
    """A paired comparison: the JSON-serialisable dict of :func:`paired_bootstrap` / :func:`subset_bootstrap`, which
    also knows how to recompute itself: ``redo(n_bootstrap, seed)``, the same comparison from other resamples, and,
    in a :func:`compare_to_best` column, ``batch`` = (run, method): ``run(methods, n_bootstrap, seed)`` recomputes
    several methods of the column in one bootstrap (the same numbers). A dict copy forgets both."""

    redo: Callable[[int, int], dict] | None = None
    batch: tuple[Callable[[tuple, int, int], dict], str] | None = None


def _redoable(out: dict, redo: Callable[[int, int], dict]) -> Comparison:
    out = out if isinstance(out, Comparison) else Comparison(out)
    out.redo = redo
    return out


def resamples(comparison: dict, key: str = "auroc") -> int:
    """The resamples behind ``comparison``'s ``key`` metric: its own count where :func:`holm_adjust` gave it more,
    else the comparison's ``n_bootstrap``."""
    return int(comparison[key].get("n_bootstrap", comparison["n_bootstrap"]))


def holm_adjust(comparisons: Sequence, key: str = "auroc", alpha: float | None = None) -> int:
    """Holm's correction over ``comparisons`` (one table's family of :func:`paired_bootstrap` / :func:`subset_bootstrap`
    results; None, the n/a ones, skipped), in place on each one's ``key`` metric: ``p_holm``, ``p_holm_interval`` (its
    Monte-Carlo interval), ``family`` (m), ``verdict_unadjusted`` (the interval's own) and ``verdict``: that when the
    whole interval of the adjusted p lies below ``alpha`` (default 1 - confidence), "not distinguishable" when at or
    above, else "undecided". One straddling ``alpha`` is first recomputed with more resamples (its ``key`` metric
    replaced, with its ``n_bootstrap``) until none does below ``pvalue.MAX_RESAMPLES`` (a plain dict cannot be).
    Applying it again to the same family gives the same result. Returns m."""
    family = [c for c in comparisons if c is not None]
    if not family:
        return 0
    verdict_log.family(key, alpha, family)
    level = np.array([(1.0 - c["confidence"]) if alpha is None else alpha for c in family])
    while True:
        p = np.array([c[key]["p"] for c in family])
        n = np.array([resamples(c, key) for c in family])
        lo, hi = pvalue.p_interval(p, n)
        adj_lo, adj_hi = holm(lo), holm(hi)
        grow = [i for i in np.flatnonzero(~pvalue.decided(adj_lo, adj_hi, level))
                if n[i] < pvalue.MAX_RESAMPLES and getattr(family[i], "redo", None) is not None]
        if not grow:
            break
        factor, jobs = _holm_factors(p), {}
        for i in grow:  # one job per comparison, or per compare_to_best column and count of resamples
            more = pvalue.next_resamples(p[i], int(n[i]), factor[i], level[i])
            batch = family[i].batch
            jobs.setdefault((i if batch is None else (id(batch[0]), family[i]["seed"]), more), []).append(family[i])
        for (_, more), comps in jobs.items():
            _grow(comps, key, more)
    for c, adj, a_lo, a_hi, lev in zip(family, holm(p), adj_lo, adj_hi, level):
        m = c[key]
        m["verdict_unadjusted"] = m.get("verdict_unadjusted", m["verdict"])
        m.update(p_holm=float(adj), p_holm_interval=[float(a_lo), float(a_hi)], family=len(family),
                 verdict=VERDICTS[2] if a_lo >= lev else m["verdict_unadjusted"] if a_hi < lev else VERDICTS[3])
    return len(family)


def _grow(comps: list, key: str, n: int) -> None:
    """``comps``' ``key`` metric recomputed from ``n`` resamples (with that count), in place: several methods of one
    :func:`compare_to_best` column in one bootstrap (``batch``), any other comparison alone (``redo``)."""
    run, seed = comps[0].batch, comps[0]["seed"]
    with bootstrap.auroc_only() if key == "auroc" else contextlib.nullcontext():
        new = {None: comps[0].redo(n, seed)} if run is None else run[0](tuple(c.batch[1] for c in comps), n, seed)
    for c in comps:
        c[key] = dict(new[None if c.batch is None else c.batch[1]][key], n_bootstrap=n)


def _holm_factors(p: np.ndarray) -> np.ndarray:
    """Each p's largest Holm factor, m minus the number of smaller p's (m for the smallest; tied p's take the first
    of their ranks: once recomputed, one of them may sort first), in the input order."""
    return p.size - np.searchsorted(np.sort(p), p, side="left").astype(np.float64)


def consistent(v: str, w: str) -> bool:
    """Whether two verdicts on one comparison (e.g. under two seeds) agree: equal, or one "undecided" (which states
    nothing: the resampling could not place the adjusted p on either side of the threshold)."""
    return v == w or VERDICTS[3] in (v, w)


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
            f"{VERDICT_RESAMPLES} resamples each, up to {pvalue.MAX_RESAMPLES} where the Monte-Carlo interval of the "
            "adjusted p straddles 0.05) are corrected together by Holm's method on their paired-bootstrap p-values: a "
            "verdict is stated only where the adjusted p is below 0.05 (its whole 99% Monte-Carlo interval; "
            "\"undecided\" where that interval still straddles 0.05); the intervals shown are the unadjusted 95% ones.")


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
    enough_per_class(rows, keys, min_per_class)
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
    return _redoable(out, lambda n, s: paired_bootstrap(
        labels, scores_a, scores_b, groups=groups, n_bootstrap=n, seed=s, confidence=confidence, fpr=fpr,
        clusters=clusters, min_per_class=min_per_class))


def _comparison(a: float, b: float, boot_a: np.ndarray, boot_b: np.ndarray, confidence: float) -> dict:
    """One metric of a paired comparison: the point estimates, each side's own interval (``a_ci``, ``b_ci``) and
    the interval of the paired difference, all from the same resamples."""
    ci = interval(boot_a - boot_b, confidence)
    return {"a": float(a), "b": float(b), "a_ci": interval(boot_a, confidence), "b_ci": interval(boot_b, confidence),
            "diff": float(a - b), "ci": ci, "verdict": verdict(ci), "p": bootstrap_p(boot_a - boot_b)}


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
    ranked = (Ranked(pa, neg), Ranked(pb, neg))
    rng = np.random.default_rng(seed)
    chunk = max(1, bootstrap.CHUNK_ELEMENTS // (2 * (neg.size + pa.size + pb.size)))
    boot: dict[str, list] = {"auroc": [], "tpr": []}  # per block: [resamples, 2] (subset A, subset B)
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        cq = resample_counts(rng, b, neg.size)
        (a1, t1), (a2, t2) = (r.rows(resample_counts(rng, b, r.pos.size), cq, fpr) for r in ranked)
        boot["auroc"].append(np.stack([a1, a2], axis=1))
        boot["tpr"].append(np.stack([t1, t2], axis=1))
    out = {"n": int(lab.shape[0]), "n_used": int(neg.size + pa.size + pb.size), "n_dropped": int((~fin).sum()),
           "n_members": [int(pa.size), int(pb.size)], "n_nonmembers": int(neg.size), "groups": None,
           "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    for j, (key, blocks) in enumerate((("auroc", boot["auroc"]), (tpr_key(fpr), boot["tpr"]))):
        draws = np.concatenate(blocks) if blocks else np.zeros((0, 2))
        out[key] = _comparison(point[0][j], point[1][j], draws[:, 0], draws[:, 1], confidence)
    return _redoable(out, lambda n, s: subset_bootstrap(
        scores, labels, members_a, members_b, n_bootstrap=n, seed=s, confidence=confidence, fpr=fpr,
        min_per_class=min_per_class))


def describe(comparison: dict, name_a: str, name_b: str, key: str = "auroc", label: str = "AUROC") -> str:
    """One sentence for a report: ``"min_k > ppl: AUROC 0.712 vs 0.655, difference +0.057 [95% CI +0.012,
    +0.101], paired bootstrap"``; ``"min_k vs ppl: not distinguishable (AUROC ...)"`` when the verdict is; after
    :func:`holm_adjust`, the adjusted p and the family's size follow the (unadjusted) interval."""
    c = comparison[key]
    pct = f"{comparison['confidence']:.0%}"
    detail = (f"{label} {fmt(c['a'])} vs {fmt(c['b'])}, difference {fmt(c['diff'], sign=True)} "
              f"[{pct} CI {fmt(c['ci'][0], sign=True)}, {fmt(c['ci'][1], sign=True)}], paired bootstrap")
    if "p_holm" in c:
        n = resamples(comparison, key)
        detail += f" ({n} resamples), Holm-adjusted p {pvalue.p_text(c['p_holm'], n)} of {c['family']}"
        if c["verdict"] == VERDICTS[3]:
            lo, hi = c["p_holm_interval"]
            detail += f", its 99% Monte-Carlo interval [{fmt(lo)}, {fmt(hi)}] straddling 0.05"
    if c["verdict"] == VERDICTS[0]:
        return f"{name_a} > {name_b}: {detail}"
    if c["verdict"] == VERDICTS[1]:
        return f"{name_b} > {name_a}: {detail}"
    return f"{name_a} vs {name_b}: {c['verdict'] if c['verdict'] == VERDICTS[3] else VERDICTS[2]} ({detail})"


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
        enough_per_class(rows, keys)
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


def _column(labels, scores: dict, best: str, others: list, groups, n_bootstrap: int, seed: int) -> dict:
    """{method: its comparison with ``best`` or None} of a :func:`compare_to_best` column, each able to recompute
    itself: ``redo`` at the column's own count gives the whole column once per seed (the seed audit: one bootstrap
    for every method), at another count that method alone; ``batch`` several methods at once (the same numbers)."""
    def run(methods, n: int, s: int) -> dict:
        return _paired_with(labels, scores, best, list(methods), groups, n, s)

    whole = functools.lru_cache(maxsize=None)(lambda s: run(others, n_bootstrap, s))

    def wrap(m: str, c: dict | None):
        def again(n: int, s: int):
            c = whole(s)[m] if n == n_bootstrap else run((m,), n, s)[m]
            return wrap(m, None if c is None else copy.deepcopy(dict(c)))
        if c is not None:
            c = _redoable(c, again)
            c.batch = (run, m)
        return c
    return {m: wrap(m, c) for m, c in run(others, n_bootstrap, seed).items()}


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
    return {"best": best, "vs": _column(labels, scores, best, others, groups, n_bootstrap, seed)}


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
    bootstrap does not place below it (interval of best - method containing 0, not stated after Holm's correction,
    "undecided", or no comparison possible)."""
    if entry is None:
        return set()
    return {entry["best"]} | {m for m, c in entry["vs"].items() if c is None or c[key]["verdict"] != VERDICTS[0]}

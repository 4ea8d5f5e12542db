"""The resampling engine behind :mod:`mia_jax.evaluation.metrics` and :mod:`mia_jax.evaluation.comparisons`: the checks
of labels and scores, the vectorised per-resample AUROC / TPR@FPR, the stratified bootstrap (one method, or several
score vectors sharing every resample, per group) and the cluster bootstrap (whole clusters resampled, as
multiplicities).

Every function here draws from ``np.random.default_rng(seed)`` in a documented order, so that the tests' slow loop
references can replay the same draws. Resamples are processed in blocks of about ``CHUNK_ELEMENTS`` values.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Sequence

import numpy as np

FPR_TARGETS = (0.001, 0.01, 0.05)
TPR_KEYS = {0.001: "tpr_at_0.1pct_fpr", 0.01: "tpr_at_1pct_fpr", 0.05: "tpr_at_5pct_fpr"}
CHUNK_ELEMENTS = 4_000_000  # bootstrap resamples are processed in blocks of about this many values
MIN_PER_CLASS = 10  # fewer members or non-members than this: no metric (n/a with the reason), never a verdict
_AUROC_ONLY = contextvars.ContextVar("auroc_only", default=False)


@contextlib.contextmanager
def auroc_only():
    """Within it, every resampled TPR@FPR is NaN, not computed (about a third of a resample's time): for callers that
    read only the resampled AUROCs (``comparisons.holm_adjust`` recomputing an AUROC comparison with more
    resamples). The AUROCs and the draws are unchanged."""
    token = _AUROC_ONLY.set(True)
    try:
        yield
    finally:
        _AUROC_ONLY.reset(token)


def too_few(n_pos: int, n_neg: int, minimum: int = MIN_PER_CLASS) -> str | None:
    """The reason a cell is n/a when a class has fewer than ``minimum`` examples (an AUROC of 3 members against 4
    non-members is 1.000 [1.000, 1.000] by chance far too often to print), else None."""
    if min(n_pos, n_neg) < minimum:
        return f"n/a: fewer than {minimum} examples per class ({n_pos} members, {n_neg} non-members)"
    return None



def as_labels(labels) -> np.ndarray:
    """``labels`` (1-D: bool, or numbers / strings that read as 0 and 1) as int64 [n] of 0 (non-member) and 1
    (member); ValueError naming the other values otherwise."""
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


def as_scores(scores, n: int) -> np.ndarray:
    """``scores`` as float64 [n] (NaN/inf kept); ValueError unless 1-D with one score per each of ``n`` labels."""
    sc = np.asarray(scores, dtype=np.float64)
    if sc.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {sc.shape}")
    if sc.shape[0] != n:
        raise ValueError(f"labels and scores differ in length: {n} labels, {sc.shape[0]} scores")
    return sc


# ---------------------------------------------------------------- bootstrap (vectorised, stratified)

def auroc_rows(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC of each row: pos [B, P], neg [B, N] -> [B] (rank-sum form, average ranks for ties)."""
    n_pos, n_neg = pos.shape[1], neg.shape[1]
    from scipy.stats import rankdata  # here: scipy.stats takes ~0.4 s to import, off the CLI's start-up

    ranks = rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    u = ranks[:, :n_pos].sum(axis=1) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def _max_false_positives(n_neg: int, fpr: float) -> int:
    """Largest k with k / n_neg <= fpr, using the same float comparison as the ROC-curve path."""
    ks = np.arange(n_neg + 1)
    return int(ks[ks / n_neg <= fpr].max())


def tpr_at_fpr_rows(pos: np.ndarray, neg: np.ndarray, fpr: float) -> np.ndarray:
    """TPR@``fpr`` of each row: pos [B, P], neg [B, N] -> [B]. With k the allowed false positives and v the
    (k+1)-th largest non-member score, the best qualifying threshold admits exactly the members scoring > v."""
    k = _max_false_positives(neg.shape[1], fpr)
    if k >= neg.shape[1]:
        return np.ones(pos.shape[0])
    v = -np.partition(-neg, k, axis=1)[:, k]
    return (pos > v[:, None]).mean(axis=1)


def stratified_bootstrap(pos, neg, n_bootstrap: int, seed: int, fpr: float) -> tuple[np.ndarray, np.ndarray]:
    """AUROC and TPR@``fpr`` [n_bootstrap] each of ``n_bootstrap`` resamples of the member scores ``pos`` and the
    non-member scores ``neg`` (each with replacement at its own count). Draws per block: members, then
    non-members."""
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_ELEMENTS // (pos.size + neg.size))
    ranked = Ranked(pos, neg)
    aucs, tprs = [], []
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        cp = resample_counts(rng, b, pos.size)
        auc, tpr = ranked.rows(cp, resample_counts(rng, b, neg.size), fpr)
        aucs.append(auc)
        tprs.append(tpr)
    return np.concatenate(aucs), np.concatenate(tprs)


def drawn_rows(pos: np.ndarray, neg: np.ndarray, ip: np.ndarray, iq: np.ndarray,
               fpr: float) -> tuple[np.ndarray, np.ndarray]:
    """AUROC and TPR@``fpr`` of each resample ``pos[ip]`` against ``neg[iq]`` (``ip`` [B, P'] indices into the
    member scores ``pos``, ``iq`` [B, N'] into the non-member scores ``neg``): the values :func:`auroc_rows` and
    :func:`tpr_at_fpr_rows` give on those rows, to the bit, computed from how many times each example is drawn
    (:class:`Ranked`: one sort of the scores, not one per resample). Scores without NaN (every caller drops NaN /
    inf first)."""
    return Ranked(pos, neg).rows(draw_counts(ip, pos.size), draw_counts(iq, neg.size), fpr)


def draw_counts(draw: np.ndarray, k: int) -> np.ndarray:
    """Times each of ``k`` examples is drawn in each row of ``draw`` [b, m] (values in [0, k)) -> int64 [b, k]."""
    b = draw.shape[0]
    flat = (draw + k * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * k).reshape(b, k)


def resample_counts(rng, b: int, n: int) -> np.ndarray:
    """int64 [b, n]: how many times each of ``n`` examples is in each of ``b`` resamples of size n with replacement,
    from ``rng.integers(0, n, size=(b, n))``."""
    return draw_counts(rng.integers(0, n, size=(b, n)), n)


class Ranked:
    """One score vector's members ``pos`` [P] and non-members ``neg`` [N] (no NaN), sorted once, for the AUROC and
    TPR@FPR of any number of resamples given as multiplicities (:meth:`rows`)."""

    def __init__(self, pos: np.ndarray, neg: np.ndarray):
        self.pos = pos
        self.neg_order = np.argsort(neg, kind="stable")
        self.neg_sorted = neg[self.neg_order]
        # each member's non-members strictly below (lo) and at or below (hi): indices into the sorted non-members
        self.lo = np.searchsorted(self.neg_sorted, pos, "left")
        self.hi = np.searchsorted(self.neg_sorted, pos, "right")

    def rows(self, cp: np.ndarray, cq: np.ndarray, fpr: float) -> tuple[np.ndarray, np.ndarray]:
        """AUROC and TPR@``fpr`` of each resample holding member i ``cp[r, i]`` times and non-member j ``cq[r, j]``
        times ([B, P], [B, N]; whole numbers): the values of :func:`auroc_rows` / :func:`tpr_at_fpr_rows` on the
        resampled rows, to the bit (integer sums, one division each)."""
        n_pos, n_neg = cp.sum(axis=1, dtype=np.int64), cq.sum(axis=1, dtype=np.int64)
        # int32 where no product below can reach 2^31 (half the memory traffic of int64)
        dtype = np.int32 if 2 * int(n_pos.max(initial=0)) * int(n_neg.max(initial=0)) < 2**31 else np.int64
        cp, cq = cp.astype(dtype, copy=False), cq.astype(dtype, copy=False)
        below = np.zeros((cq.shape[0], cq.shape[1] + 1), dtype)  # [B, N + 1]: drawn non-members below each index
        np.cumsum(cq[:, self.neg_order], axis=1, out=below[:, 1:])
        # twice the rank-sum statistic: 2 * (non-members below) + (ties) per drawn member
        twice_u = (cp * (below[:, self.lo] + below[:, self.hi])).sum(axis=1, dtype=np.int64)
        auc = 0.5 * twice_u / (n_pos * n_neg)
        if _AUROC_ONLY.get():
            return auc, np.full(auc.shape, np.nan)
        # k: the largest count with k / n_neg <= fpr (the float comparison of _max_false_positives)
        k = np.floor(fpr * n_neg)
        k = np.where((k + 1) / n_neg <= fpr, k + 1, k)
        k = np.where(k / n_neg > fpr, k - 1, k)
        # the (k+1)-th largest drawn non-member: the last sorted index j with n_neg - below[j] >= k + 1
        j = (below[:, :-1] <= (n_neg - k - 1)[:, None]).sum(axis=1) - 1
        v = self.neg_sorted[np.maximum(j, 0)]
        above = np.where(self.pos[None, :] > v[:, None], cp, 0).sum(axis=1, dtype=np.int64)
        return auc, np.where(k >= n_neg, 1.0, above / n_pos)


def interval(values: np.ndarray, confidence: float) -> list[float]:
    """The percentile interval ``[lo, hi]`` holding the central ``confidence`` share of ``values``."""
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def tpr_key(fpr: float) -> str:
    """The result key of TPR at ``fpr`` (``"tpr_at_5pct_fpr"`` for 0.05; ``"tpr_at_<fpr>_fpr"`` off the table)."""
    return TPR_KEYS.get(fpr, f"tpr_at_{fpr:g}_fpr")


def group_rows(lab: np.ndarray, groups, n: int) -> tuple[list, list[tuple[np.ndarray, np.ndarray]]]:
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


def grouped_bootstrap(vectors: Sequence[np.ndarray], rows, n_bootstrap: int, seed: int, fpr: float, *,
                      block_vectors: int | None = None):
    """Mean over groups of AUROC and TPR@``fpr`` of each score vector, on the data and on ``n_bootstrap`` stratified
    resamples that are **shared by all vectors** (paired): -> (auroc [V], tpr [V], boot_auroc [B, V], boot_tpr [B, V]).

    The draws, in order: per block of ``max(1, CHUNK_ELEMENTS // (V' * n))`` resamples (``V'``: ``block_vectors``,
    default V; ``comparisons.compare_to_best`` passes 2 so that its V methods get the very resamples of each
    pairwise ``paired_bootstrap``: the vectors are gathered one at a time, so memory does not grow with V), per group
    in order,
    ``rng.integers(0, P_g, (b, P_g))`` for its members, then ``rng.integers(0, N_g, (b, N_g))`` for its
    non-members (``rng = np.random.default_rng(seed)``)."""
    n_groups = len(rows)
    point_auc = np.zeros(len(vectors))
    point_tpr = np.zeros(len(vectors))
    for pos, neg in rows:
        for v, sc in enumerate(vectors):
            point_auc[v] += auroc_rows(sc[pos][None], sc[neg][None])[0]
            point_tpr[v] += tpr_at_fpr_rows(sc[pos][None], sc[neg][None], fpr)[0]
    n_total = sum(p.size + q.size for p, q in rows)
    ranked = [[Ranked(sc[pos], sc[neg]) for sc in vectors] for pos, neg in rows]
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_ELEMENTS // ((block_vectors or len(vectors)) * n_total))
    aucs, tprs = [], []
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        auc = np.zeros((b, len(vectors)))
        tpr = np.zeros((b, len(vectors)))
        for (pos, neg), group_ranked in zip(rows, ranked):
            cp = resample_counts(rng, b, pos.size)
            cq = resample_counts(rng, b, neg.size)
            for v, r in enumerate(group_ranked):
                x, y = r.rows(cp, cq, fpr)
                auc[:, v] += x
                tpr[:, v] += y
        aucs.append(auc / n_groups)
        tprs.append(tpr / n_groups)
    boot_auc = np.concatenate(aucs) if aucs else np.zeros((0, len(vectors)))
    boot_tpr = np.concatenate(tprs) if tprs else np.zeros((0, len(vectors)))
    return point_auc / n_groups, point_tpr / n_groups, boot_auc, boot_tpr


# ---------------------------------------------------------------- cluster bootstrap (vectorised, weighted)

_MAX_REDRAW_ROUNDS = 1000  # a group with a mixed cluster has P(one-class resample) <= (1 - 1/K)^K < 1/e


def cluster_ids(clusters, n: int) -> np.ndarray:
    """int64 [n]: each example's cluster, numbered in order of first appearance."""
    keys = list(clusters)
    if len(keys) != n:
        raise ValueError(f"clusters and labels differ in length: {len(keys)} clusters, {n} labels")
    index: dict = {}
    try:
        return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)
    except TypeError:
        raise ValueError("clusters must be hashable keys (e.g. a title or an id), one per example") from None


class ClusterDraw:
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
        self.local = cluster_ids(cid[rows].tolist(), rows.size)
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
                counts[:, cl] = resample_counts(rng, b, cl.size)
            return counts[:, self.local], 0
        counts = resample_counts(rng, b, self.k)
        redrawn = 0
        for _ in range(_MAX_REDRAW_ROUNDS):
            bad = np.flatnonzero((counts @ self.n_pos == 0) | (counts @ self.n_neg == 0))
            if not bad.size:
                return counts[:, self.local], redrawn
            redrawn += int(bad.size)
            counts[bad] = resample_counts(rng, bad.size, self.k)
        raise RuntimeError("cluster bootstrap: resamples with one class kept coming back")  # P < e^-1000


def cluster_bootstrap(vectors: Sequence[np.ndarray], draws: Sequence[ClusterDraw], n_bootstrap: int, seed: int,
                       fpr: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean over groups (``draws``, one per group) of AUROC and TPR@``fpr`` of each score vector on ``n_bootstrap``
    cluster resamples shared by all vectors: -> (boot_auroc [B, V], boot_tpr [B, V], resamples redrawn). Blocks of
    ``max(1, CHUNK_ELEMENTS // (V * n))`` resamples, as :func:`grouped_bootstrap`."""
    n_total = sum(d.rows.size for d in draws)
    ranked = [[Ranked(sc[d.rows][d.lab == 1], sc[d.rows][d.lab == 0]) for sc in vectors] for d in draws]
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_ELEMENTS // (len(vectors) * n_total))
    aucs, tprs, redrawn = [], [], 0
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        auc = np.zeros((b, len(vectors)))
        tpr = np.zeros((b, len(vectors)))
        for d, group_ranked in zip(draws, ranked):
            w, again = d.weights(rng, b)
            redrawn += again
            member = d.lab == 1
            for v, r in enumerate(group_ranked):
                x, y = r.rows(w[:, member], w[:, ~member], fpr)
                auc[:, v] += x
                tpr[:, v] += y
        aucs.append(auc / len(draws))
        tprs.append(tpr / len(draws))
    empty = np.zeros((0, len(vectors)))
    return (np.concatenate(aucs) if aucs else empty, np.concatenate(tprs) if tprs else empty, redrawn)

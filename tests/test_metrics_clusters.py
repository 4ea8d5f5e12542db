"""The cluster bootstrap of metrics.evaluate / metrics.paired_bootstrap (``clusters=``): against a slow loop reference
that rebuilds every resample as a list of examples (the same RNG draws), the plain bootstrap when every cluster is
one example, the deduplicated data when clusters are exact copies, and a hand-made case whose verdict changes."""
import time

import numpy as np
import pytest
from helpers import tpr_ref
from sklearn.metrics import roc_auc_score

from mia_jax.evaluation import bootstrap as bs
from mia_jax.evaluation import comparisons as cmp
from mia_jax.evaluation import metrics as m


def cluster_ref(labels, vectors, clusters, groups, n_bootstrap, seed, fpr=0.05):
    """The obvious loop: per block of resamples, per group (first appearance), its clusters (first appearance) as
    lists of rows; stratified (member clusters then non-member clusters) when no cluster mixes labels, else all
    clusters with the one-class resamples redrawn (ascending) until none is left; each resample concatenated and
    scored through sklearn and the threshold scan. -> (auroc [B, V], tpr [B, V]), means over groups."""
    labels = np.asarray(labels)
    n = labels.size
    groups = [0] * n if groups is None else list(groups)
    plans = []
    for g in dict.fromkeys(groups):
        by_cluster = {}
        for i in range(n):
            if groups[i] == g:
                by_cluster.setdefault(clusters[i], []).append(i)
        cl = [np.array(v) for v in by_cluster.values()]
        plans.append((cl, [set(labels[c].tolist()) for c in cl]))
    rng = np.random.default_rng(seed)
    chunk = max(1, bs.CHUNK_ELEMENTS // (len(vectors) * n))
    auc, tpr = [], []
    for start in range(0, n_bootstrap, chunk):
        nb = min(chunk, n_bootstrap - start)
        per_group = []
        for cl, labs in plans:
            if all(len(s) == 1 for s in labs):
                pc = [c for c, s in zip(cl, labs) if s == {1}]
                nc = [c for c, s in zip(cl, labs) if s == {0}]
                dp = rng.integers(0, len(pc), size=(nb, len(pc)))
                dn = rng.integers(0, len(nc), size=(nb, len(nc)))
                samples = [np.concatenate([pc[j] for j in dp[i]] + [nc[j] for j in dn[i]]) for i in range(nb)]
            else:
                d = rng.integers(0, len(cl), size=(nb, len(cl)))
                samples = [np.concatenate([cl[j] for j in d[i]]) for i in range(nb)]
                bad = [i for i in range(nb) if len(set(labels[samples[i]].tolist())) < 2]
                while bad:
                    d = rng.integers(0, len(cl), size=(len(bad), len(cl)))
                    for r, i in enumerate(bad):
                        samples[i] = np.concatenate([cl[j] for j in d[r]])
                    bad = [i for i in bad if len(set(labels[samples[i]].tolist())) < 2]
            per_group.append(samples)
        for i in range(nb):
            auc.append([np.mean([roc_auc_score(labels[s[i]], v[s[i]]) for s in per_group]) for v in vectors])
            tpr.append([np.mean([tpr_ref(labels[s[i]], v[s[i]], fpr) for s in per_group]) for v in vectors])
    return np.array(auc), np.array(tpr)


def q(x):
    return list(np.quantile(x, [0.025, 0.975]))


def clustered_case(seed, sizes_pos=(1, 3, 5, 2, 4, 6), sizes_neg=(2, 2, 7, 1, 3), mixed=0, levels=None,
                   book_sd=1.0):
    """Clusters of the given sizes (members' then non-members'), rows shuffled; scores = book effect + noise + a
    small member shift; ``mixed`` extra clusters hold 3 members and 3 non-members each."""
    rng = np.random.default_rng(seed)
    labels, clusters = [], []
    for j, k in enumerate(sizes_pos):
        labels += [1] * k
        clusters += [f"p{j}"] * k
    for j, k in enumerate(sizes_neg):
        labels += [0] * k
        clusters += [f"n{j}"] * k
    for j in range(mixed):
        labels += [1, 0] * 3
        clusters += [f"m{j}"] * 6
    order = rng.permutation(len(labels))
    labels, clusters = np.array(labels)[order], [clusters[i] for i in order]
    effect = {c: rng.normal() * book_sd for c in dict.fromkeys(clusters)}
    a = np.array([effect[c] for c in clusters]) + 0.5 * rng.normal(size=labels.size) + 0.4 * labels
    b = 0.5 * a + rng.normal(size=labels.size)
    if levels:  # ties within and across classes
        a, b = np.round(a * levels) / levels, np.round(b * levels) / levels
    return labels, a, b, clusters


# ---------------------------------------------------------------- against the loop reference

@pytest.mark.parametrize("seed, mixed, levels", [(0, 0, None), (1, 0, 2), (2, 1, None), (3, 2, 3)])
def test_evaluate_matches_loop_reference(seed, mixed, levels):
    labels, a, _, clusters = clustered_case(seed, mixed=mixed, levels=levels)
    r = m.evaluate(labels, a, n_bootstrap=80, seed=seed, clusters=clusters)
    auc, tpr = cluster_ref(labels, [a], clusters, None, 80, seed)
    assert r["auroc_ci"] == pytest.approx(q(auc[:, 0]), abs=1e-12)
    assert r["tpr_at_5pct_fpr_ci"] == pytest.approx(q(tpr[:, 0]), abs=1e-12)
    assert r["clusters"] == len(set(clusters)) and r["bootstrap"] == "cluster"
    assert r["cluster_stratified"] is (mixed == 0)
    if mixed == 0:
        assert r["n_redrawn"] == 0


def test_unstratified_redraws_one_class_resamples():
    # two pure member clusters and one mixed cluster: a third of the resamples miss the mixed one, and those with
    # only member clusters are redrawn (never a NaN AUROC)
    labels = np.r_[np.ones(10, int), np.ones(10, int), [1, 0, 0, 0, 0, 0]]
    clusters = ["a"] * 10 + ["b"] * 10 + ["c"] * 6
    s = np.random.default_rng(4).normal(size=labels.size)
    r = m.evaluate(labels, s, n_bootstrap=300, seed=2, clusters=clusters, min_per_class=1)
    assert r["cluster_stratified"] is False and 40 < r["n_redrawn"] < 150
    auc, tpr = cluster_ref(labels, [s], clusters, None, 300, 2)
    assert np.isfinite(auc).all() and r["auroc_ci"] == pytest.approx(q(auc[:, 0]), abs=1e-12)
    assert r["tpr_at_5pct_fpr_ci"] == pytest.approx(q(tpr[:, 0]), abs=1e-12)


@pytest.mark.parametrize("seed, grouped, mixed", [(5, False, 0), (6, True, 0), (7, True, 1), (8, False, 1)])
def test_paired_matches_loop_reference(seed, grouped, mixed, monkeypatch):
    labels, a, b, clusters = clustered_case(seed, mixed=mixed, levels=4 if seed % 2 else None)
    # groups: rows split by position; a cluster found in both groups is two clusters (one per group)
    groups = np.where(np.arange(labels.size) < labels.size // 2, "x", "y") if grouped else None
    if grouped:  # every group needs both classes
        labels[:2], labels[-2:] = [0, 1], [0, 1]
        clusters = [c if not c.startswith(("p", "n")) else ("p" if labels[i] else "n") + c[1:]
                    for i, c in enumerate(clusters)]
    monkeypatch.setattr(bs, "CHUNK_ELEMENTS", 2 * labels.size * 13)  # blocks of 13 resamples
    res = cmp.paired_bootstrap(labels, a, b, groups=groups, clusters=clusters, n_bootstrap=40, seed=seed,
                             min_per_class=1)
    auc, tpr = cluster_ref(labels, [a, b], clusters, groups, 40, seed)
    assert res["auroc"]["ci"] == pytest.approx(q(auc[:, 0] - auc[:, 1]), abs=1e-12)
    assert res["tpr_at_5pct_fpr"]["ci"] == pytest.approx(q(tpr[:, 0] - tpr[:, 1]), abs=1e-12)
    plain = cmp.paired_bootstrap(labels, a, b, groups=groups, n_bootstrap=40, seed=seed, min_per_class=1)
    for key in ("auroc", "tpr_at_5pct_fpr"):  # the point estimates do not depend on the clusters
        assert [res[key][k] for k in ("a", "b", "diff")] == [plain[key][k] for k in ("a", "b", "diff")]
    n_clusters = len({(g, c) for g, c in zip(groups if grouped else [0] * labels.size, clusters)})
    assert res["clusters"] == n_clusters and res["bootstrap"] == "cluster"
    assert "clusters" not in plain and "bootstrap" not in plain  # the unclustered dict is unchanged


# ---------------------------------------------------------------- properties

def test_point_estimates_unchanged_and_singletons_equal_plain_bootstrap():
    rng = np.random.default_rng(9)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + 0.6 * y, 1)  # ties
    plain = m.evaluate(y, s, n_bootstrap=300, seed=4)
    one = m.evaluate(y, s, n_bootstrap=300, seed=4, clusters=[f"t{i}" for i in range(200)])
    assert {k: one[k] for k in plain} == plain  # every interval too: the draws are the plain bootstrap's
    assert one["clusters"] == 200 and one["cluster_stratified"] is True
    b = s + rng.normal(size=200)
    groups = ["u" if i % 3 else "v" for i in range(200)]
    p_plain = cmp.paired_bootstrap(y, s, b, groups=groups, n_bootstrap=200, seed=1)
    p_one = cmp.paired_bootstrap(y, s, b, groups=groups, n_bootstrap=200, seed=1, clusters=range(200))
    assert {k: p_one[k] for k in p_plain} == p_plain


def test_duplicated_examples_give_the_deduplicated_interval():
    """Every example copied 5 times: resampling copies as independent gives a ~sqrt(5) narrower interval; resampling
    the 5 copies of an example together gives exactly the interval of the data without copies."""
    rng = np.random.default_rng(10)
    y = np.r_[np.ones(30, int), np.zeros(30, int)]
    s = rng.normal(size=60) + 0.7 * y
    dup_y, dup_s, dup_c = np.repeat(y, 5), np.repeat(s, 5), np.repeat(np.arange(60), 5)
    dedup = m.evaluate(y, s, n_bootstrap=500, seed=3)
    clustered = m.evaluate(dup_y, dup_s, n_bootstrap=500, seed=3, clusters=dup_c)
    naive = m.evaluate(dup_y, dup_s, n_bootstrap=500, seed=3)
    assert clustered["auroc"] == naive["auroc"] == dedup["auroc"]
    assert clustered["auroc_ci"] == pytest.approx(dedup["auroc_ci"], abs=1e-12)
    assert clustered["tpr_at_5pct_fpr_ci"] == pytest.approx(dedup["tpr_at_5pct_fpr_ci"], abs=1e-12)
    width = {k: r["auroc_ci"][1] - r["auroc_ci"][0] for k, r in (("c", clustered), ("n", naive))}
    assert width["c"] > 1.8 * width["n"]


def test_paired_verdict_becomes_not_distinguishable_with_books():
    """12 books (6 seen, 6 unseen), 25 snippets each. B has no signal; A = B + a book-level offset that happens to be
    higher on these seen books. Snippets as independent: "A > B"; books resampled: not distinguishable."""
    rng = np.random.default_rng(0)
    offsets = {**{f"seen{j}": o for j, o in enumerate([1.0, 0.6, 0.2, -0.2, 0.8, -0.5])},
               **{f"unseen{j}": o for j, o in enumerate([-0.4, 0.3, -0.9, 0.1, -0.3, 0.5])}}
    books = [t for t in offsets for _ in range(25)]
    labels = np.array([int(t.startswith("seen")) for t in books])
    b = rng.normal(size=labels.size)
    a = b + np.array([offsets[t] for t in books]) + 0.3 * rng.normal(size=labels.size)
    plain = cmp.paired_bootstrap(labels, a, b, n_bootstrap=1000, seed=0)
    by_book = cmp.paired_bootstrap(labels, a, b, n_bootstrap=1000, seed=0, clusters=books)
    assert plain["auroc"]["verdict"] == "A > B"
    assert by_book["auroc"]["verdict"] == "not distinguishable"
    assert by_book["auroc"]["diff"] == plain["auroc"]["diff"] > 0
    assert by_book["clusters"] == 12 and by_book["cluster_stratified"] is True
    swapped = cmp.paired_bootstrap(labels, b, a, n_bootstrap=1000, seed=0, clusters=books)
    assert swapped["auroc"]["ci"] == [-by_book["auroc"]["ci"][1], -by_book["auroc"]["ci"][0]]


def test_nan_scores_and_one_class():
    labels = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    s = np.array([0.9, np.nan, 0.8, 0.1, 0.3, 0.2, np.nan, 0.5])
    clusters = ["a", "a", "b", "c", "c", "d", "e", "d"]  # e: its only example is NaN
    r = m.evaluate(labels, s, n_bootstrap=50, clusters=clusters)
    assert r["n_nan"] == 2 and r["clusters"] == 4 and r["auroc"] == m.evaluate(labels, s, n_bootstrap=0)["auroc"]
    one = m.evaluate([1, 1, 1], [0.1, 0.2, 0.3], clusters=["a", "a", "b"])
    assert one["auroc"] is None and one["clusters"] == 2 and one["cluster_stratified"] is None
    assert m.evaluate(labels, s, n_bootstrap=0, clusters=clusters)["auroc_ci"] is None


def test_bad_clusters():
    y, s = [1, 0, 1, 0], [0.4, 0.1, 0.3, 0.2]
    with pytest.raises(ValueError, match="clusters and labels differ in length: 3 clusters, 4 labels"):
        m.evaluate(y, s, clusters=["a", "b", "c"])
    with pytest.raises(ValueError, match="clusters and labels differ in length: 5 clusters, 4 labels"):
        cmp.paired_bootstrap(y, s, s, clusters=["a"] * 5)
    with pytest.raises(ValueError, match="hashable"):
        m.evaluate(y, s, clusters=[[1], [2], [3], [4]])


def test_cluster_bootstrap_is_fast():
    rng = np.random.default_rng(12)
    y = rng.integers(0, 2, 5000)
    clusters = [f"{lab}-{i % 200}" for i, lab in enumerate(y)]  # 400 single-label clusters
    s = rng.normal(size=5000) + 0.3 * y
    t = time.perf_counter()
    r = m.evaluate(y, s, n_bootstrap=1000, clusters=clusters)
    assert time.perf_counter() - t < 10.0  # about 1-2 s on one core
    assert r["clusters"] == 400 and r["auroc_ci"][0] < r["auroc"] < r["auroc_ci"][1]

"""metrics.paired_bootstrap / evaluate_mean / subset_bootstrap against slow loop references with the same RNG draws,
and hand-made cases whose verdict is known."""
import numpy as np
import pytest
from helpers import tpr_ref
from sklearn.metrics import roc_auc_score

from mia_jax.evaluation import bootstrap as bs
from mia_jax.evaluation import comparisons as cmp
from mia_jax.evaluation import metrics as m


def paired_ref(labels, a, b, groups, n_bootstrap, seed, fpr=0.05, sides=None):
    """The obvious loop: the same draws as bootstrap.grouped_bootstrap (per block, per group, members then
    non-members), then one resample at a time through sklearn and the threshold scan. ``sides`` (a dict) receives
    each side's own resampled AUROC, ``"a"`` and ``"b"``."""
    labels, a, b = np.asarray(labels), np.asarray(a, float), np.asarray(b, float)
    groups = np.asarray(groups if groups is not None else [0] * len(labels))
    keys = list(dict.fromkeys(groups.tolist()))
    rows = [(np.flatnonzero((groups == k) & (labels == 1)), np.flatnonzero((groups == k) & (labels == 0)))
            for k in keys]
    rng = np.random.default_rng(seed)
    chunk = max(1, bs.CHUNK_ELEMENTS // (2 * len(labels)))
    diffs_auc, diffs_tpr = [], []
    for start in range(0, n_bootstrap, chunk):
        nb = min(chunk, n_bootstrap - start)
        draws = [(pos[rng.integers(0, pos.size, size=(nb, pos.size))],
                  neg[rng.integers(0, neg.size, size=(nb, neg.size))]) for pos, neg in rows]
        for i in range(nb):
            da = dt = sa = sb = 0.0
            for ip, iq in draws:
                idx = np.concatenate([ip[i], iq[i]])
                y = np.r_[np.ones(ip.shape[1]), np.zeros(iq.shape[1])]
                sa += roc_auc_score(y, a[idx])
                sb += roc_auc_score(y, b[idx])
                da += roc_auc_score(y, a[idx]) - roc_auc_score(y, b[idx])
                dt += tpr_ref(y, a[idx], fpr) - tpr_ref(y, b[idx], fpr)
            diffs_auc.append(da / len(rows))
            diffs_tpr.append(dt / len(rows))
            if sides is not None:
                sides.setdefault("a", []).append(sa / len(rows))
                sides.setdefault("b", []).append(sb / len(rows))
    return np.array(diffs_auc), np.array(diffs_tpr)


def case(seed, n_pos=40, n_neg=50, levels=None):
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(n_pos, int), np.zeros(n_neg, int)]
    rng.shuffle(labels)
    a = rng.normal(size=labels.size) + 0.8 * labels
    b = 0.5 * a + rng.normal(size=labels.size) + 0.3 * labels
    if levels:  # ties within and across classes
        a, b = np.round(a * levels) / levels, np.round(b * levels) / levels
    return labels, a, b


@pytest.mark.parametrize("seed, levels, grouped", [(0, None, False), (1, 2, False), (2, None, True), (3, 3, True)])
def test_paired_matches_loop_reference(seed, levels, grouped):
    labels, a, b = case(seed, levels=levels)
    groups = np.array(["x", "y", "z"])[np.arange(labels.size) % 3] if grouped else None
    n_boot = 60
    res = cmp.paired_bootstrap(labels, a, b, groups=groups, n_bootstrap=n_boot, seed=seed, min_per_class=1)
    sides = {}
    d_auc, d_tpr = paired_ref(labels, a, b, groups, n_boot, seed, sides=sides)
    assert res["auroc"]["ci"] == pytest.approx(list(np.quantile(d_auc, [0.025, 0.975])), abs=1e-12)
    # each side's own interval, from the same resamples (the claims tables print it beside the point estimate)
    assert res["auroc"]["a_ci"] == pytest.approx(list(np.quantile(sides["a"], [0.025, 0.975])), abs=1e-12)
    assert res["auroc"]["b_ci"] == pytest.approx(list(np.quantile(sides["b"], [0.025, 0.975])), abs=1e-12)
    # several vectors on the same examples: the mean over vectors, one shared resample for all of them
    both = cmp.evaluate_mean(labels, np.stack([a, b]), groups if grouped else np.zeros(labels.size), n_bootstrap=n_boot,
                           seed=seed, min_per_class=1)
    mean_ab = (np.array(sides["a"]) + np.array(sides["b"])) / 2
    assert both["auroc_ci"] == pytest.approx(list(np.quantile(mean_ab, [0.025, 0.975])), abs=1e-12)
    assert res["tpr_at_5pct_fpr"]["ci"] == pytest.approx(list(np.quantile(d_tpr, [0.025, 0.975])), abs=1e-12)
    keys = [None] if groups is None else ["x", "y", "z"]
    sel = [np.ones(labels.size, bool)] if groups is None else [groups == k for k in keys]
    point_a = np.mean([roc_auc_score(labels[s], a[s]) for s in sel])
    point_b = np.mean([roc_auc_score(labels[s], b[s]) for s in sel])
    assert res["auroc"]["a"] == pytest.approx(point_a, abs=1e-12)
    assert res["auroc"]["diff"] == pytest.approx(point_a - point_b, abs=1e-12)
    assert res["tpr_at_5pct_fpr"]["a"] == pytest.approx(np.mean([tpr_ref(labels[s], a[s], 0.05) for s in sel]))
    assert res["groups"] == (None if groups is None else keys)


def test_paired_blocks_match_one_block(monkeypatch):
    """Splitting the resamples into blocks changes the draws' layout but the reference follows the same blocks."""
    labels, a, b = case(5)
    monkeypatch.setattr(bs, "CHUNK_ELEMENTS", 2 * labels.size * 7)  # blocks of 7 resamples
    res = cmp.paired_bootstrap(labels, a, b, n_bootstrap=30, seed=9)
    d_auc, _ = paired_ref(labels, a, b, None, 30, 9)
    assert res["auroc"]["ci"] == pytest.approx(list(np.quantile(d_auc, [0.025, 0.975])), abs=1e-12)


def test_hand_made_verdicts():
    labels = np.r_[np.ones(50, int), np.zeros(50, int)]
    rng = np.random.default_rng(0)
    perfect = labels + 0.01 * rng.random(100)
    noise = rng.random(100)
    res = cmp.paired_bootstrap(labels, perfect, noise, n_bootstrap=200)
    assert res["auroc"]["a"] == 1.0 and res["auroc"]["verdict"] == "A > B" and res["auroc"]["ci"][0] > 0.2
    swapped = cmp.paired_bootstrap(labels, noise, perfect, n_bootstrap=200)
    assert swapped["auroc"]["verdict"] == "B > A"
    assert swapped["auroc"]["ci"] == pytest.approx([-res["auroc"]["ci"][1], -res["auroc"]["ci"][0]], abs=1e-12)
    # the same scores: every resample's difference is 0, so the interval is [0, 0] and contains 0
    same = cmp.paired_bootstrap(labels, noise, noise.copy(), n_bootstrap=50)
    assert same["auroc"]["ci"] == [0.0, 0.0] and same["auroc"]["verdict"] == "not distinguishable"
    # a monotone transform does not change any AUROC: not distinguishable
    mono = cmp.paired_bootstrap(labels, noise, np.exp(3 * noise), n_bootstrap=50)
    assert mono["auroc"]["diff"] == 0.0 and mono["auroc"]["verdict"] == "not distinguishable"
    # two models of the same signal plus independent noise: not distinguishable at this size
    sig = labels * 0.5
    close = cmp.paired_bootstrap(labels, sig + rng.normal(size=100), sig + rng.normal(size=100), n_bootstrap=300)
    assert close["auroc"]["ci"][0] < 0 < close["auroc"]["ci"][1]
    assert close["auroc"]["verdict"] == "not distinguishable"
    assert "not distinguishable" in cmp.describe(close, "a", "b") and cmp.describe(res, "min_k", "ppl").startswith(
        "min_k > ppl: AUROC 1.000")


def test_paired_drops_nan_rows_from_both_and_checks_input():
    labels, a, b = case(4)
    a[[0, 3]] = np.nan
    b[[3, 7]] = np.inf
    res = cmp.paired_bootstrap(labels, a, b, n_bootstrap=20)
    keep = np.isfinite(a) & np.isfinite(b)
    assert res["n_dropped"] == 3 and res["n_used"] == labels.size - 3
    assert res["auroc"]["b"] == pytest.approx(roc_auc_score(labels[keep], b[keep]))
    with pytest.raises(ValueError, match="n_bootstrap must be >= 1"):
        cmp.paired_bootstrap(labels, a, b, n_bootstrap=0)
    with pytest.raises(ValueError, match="differ in length"):
        cmp.paired_bootstrap(labels, a, b[:-1])
    with pytest.raises(ValueError, match="both classes in group 'g1'"):
        cmp.paired_bootstrap([1, 0, 1, 1], [1, 2, 3, 4], [4, 3, 2, 1], groups=["g0", "g0", "g1", "g1"], n_bootstrap=5)
    assert cmp.paired_bootstrap(labels, a, b, n_bootstrap=20, seed=3) == cmp.paired_bootstrap(labels, a, b,
                                                                                          n_bootstrap=20, seed=3)


def test_evaluate_mean_is_the_mean_of_the_groups():
    labels, a, _ = case(6, n_pos=60, n_neg=60)
    groups = np.arange(labels.size) % 2
    res = cmp.evaluate_mean(labels, a, groups, n_bootstrap=100, seed=1)
    want = np.mean([m.auroc(labels[groups == g], a[groups == g]) for g in (0, 1)])
    assert res["auroc"] == pytest.approx(want) and res["n_groups"] == 2
    lo, hi = res["auroc_ci"]
    assert lo < want < hi
    # the same draws as the paired bootstrap: its A-vs-constant-shift interval is the mean's interval minus 0.5
    flat = cmp.paired_bootstrap(labels, a, np.zeros_like(a), groups=groups, n_bootstrap=100, seed=1)
    assert flat["auroc"]["ci"] == pytest.approx([lo - 0.5, hi - 0.5], abs=1e-12)


def test_evaluate_mean_of_several_vectors():
    labels, a, b = case(7, n_pos=50, n_neg=50)
    groups = np.arange(labels.size) % 2
    # one vector stacked is the one-vector result, bit for bit
    assert cmp.evaluate_mean(labels, a[None], groups, n_bootstrap=50, seed=2) == cmp.evaluate_mean(
        labels, a, groups, n_bootstrap=50, seed=2)
    res = cmp.evaluate_mean(labels, np.stack([a, b]), groups, n_bootstrap=50, seed=2)
    want = np.mean([m.auroc(labels[groups == g], v[groups == g]) for g in (0, 1) for v in (a, b)])
    assert res["auroc"] == pytest.approx(want, abs=1e-12)
    # a score and its negation: the mean AUROC is 0.5 in every resample (the mirrored Smaller-Ref pair)
    mirror = cmp.evaluate_mean(labels, np.stack([a, -a]), groups, n_bootstrap=50, seed=2)
    assert mirror["auroc"] == pytest.approx(0.5) and mirror["auroc_ci"] == pytest.approx([0.5, 0.5])
    # an example NaN in one vector is dropped from all
    b2 = b.copy()
    b2[[0, 5]] = np.nan
    keep = np.isfinite(b2)
    dropped = cmp.evaluate_mean(labels, np.stack([a, b2]), groups, n_bootstrap=0)
    want = np.mean([m.auroc(labels[keep & (groups == g)], v[keep & (groups == g)]) for g in (0, 1) for v in (a, b)])
    assert dropped["n_nan"] == 2 and dropped["auroc"] == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="shape"):
        cmp.evaluate_mean(labels, np.stack([a, b])[:, :-1], groups)


def test_subset_bootstrap_against_loop():
    rng = np.random.default_rng(2)
    labels = np.r_[np.ones(60, int), np.zeros(40, int)]
    occ = np.r_[np.repeat([1, 4], 30), np.zeros(40, int)]
    scores = rng.normal(size=100) + 0.3 * occ
    res = cmp.subset_bootstrap(scores, labels, occ == 4, occ == 1, n_bootstrap=40, seed=0)
    neg, pa, pb = scores[labels == 0], scores[occ == 4], scores[occ == 1]
    rng = np.random.default_rng(0)
    q = neg[rng.integers(0, 40, (40, 40))]
    p1, p2 = pa[rng.integers(0, 30, (40, 30))], pb[rng.integers(0, 30, (40, 30))]
    y = np.r_[np.ones(30), np.zeros(40)]
    diffs = [roc_auc_score(y, np.r_[p1[i], q[i]]) - roc_auc_score(y, np.r_[p2[i], q[i]]) for i in range(40)]
    assert res["auroc"]["ci"] == pytest.approx(list(np.quantile(diffs, [0.025, 0.975])), abs=1e-12)
    side_a = [roc_auc_score(y, np.r_[p1[i], q[i]]) for i in range(40)]
    side_b = [roc_auc_score(y, np.r_[p2[i], q[i]]) for i in range(40)]
    assert res["auroc"]["a_ci"] == pytest.approx(list(np.quantile(side_a, [0.025, 0.975])), abs=1e-12)
    assert res["auroc"]["b_ci"] == pytest.approx(list(np.quantile(side_b, [0.025, 0.975])), abs=1e-12)
    assert res["auroc"]["a"] == pytest.approx(roc_auc_score(y, np.r_[pa, neg]))
    assert res["n_members"] == [30, 30]
    with pytest.raises(ValueError, match="members"):
        cmp.subset_bootstrap(scores, labels, labels == 0, occ == 1)


def test_compare_to_best_bolds_the_best_and_its_ties():
    rng = np.random.default_rng(1)
    labels = np.r_[np.ones(60, int), np.zeros(60, int)]
    strong = labels * 2.0 + rng.normal(size=120)
    scores = {"strong": strong, "close": strong + 0.05 * rng.normal(size=120), "noise": rng.normal(size=120),
              "empty": np.full(120, np.nan)}
    points = {k: (None if k == "empty" else m.auroc(labels, v)) for k, v in scores.items()}
    entry = cmp.compare_to_best(labels, scores, points, n_bootstrap=200, seed=0)
    assert entry["best"] == max(("strong", "close"), key=points.get)
    assert set(entry["vs"]) == {"strong", "close", "noise"} - {entry["best"]}  # no point estimate: not compared
    other = ({"strong", "close"} - {entry["best"]}).pop()
    assert entry["vs"][other] == cmp.paired_bootstrap(labels, scores[entry["best"]], scores[other], n_bootstrap=200,
                                                    seed=0)
    assert cmp.tied_with_best(entry) == {"strong", "close"}  # noise is placed below the best: not bold
    assert cmp.compare_to_best(labels, scores, {"empty": None}) is None and cmp.tied_with_best(None) == set()
    # a comparison that cannot be made (one class left) does not hide a method: it stays with the best
    one_class = dict(scores, close=np.where(labels == 1, np.nan, scores["close"]))
    entry = cmp.compare_to_best(labels, one_class, {"strong": 0.9, "close": 0.8}, n_bootstrap=20)
    assert entry["vs"]["close"] is None and cmp.tied_with_best(entry) == {"strong", "close"}

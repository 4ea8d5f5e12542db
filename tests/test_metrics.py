import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sklearn_roc_curve

from mia_jax.evaluation import bootstrap as bs
from mia_jax.evaluation import comparisons as cmp
from mia_jax.evaluation import metrics as m

# ---------------------------------------------------------------- brute-force float64 references

def auroc_ref(labels, scores):
    pos = np.asarray(scores, np.float64)[np.asarray(labels) == 1]
    neg = np.asarray(scores, np.float64)[np.asarray(labels) == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def operating_points(labels, scores):
    """(fpr, tpr) for every threshold in {+inf} U scores, predicting member when score >= threshold."""
    labels, scores = np.asarray(labels), np.asarray(scores, np.float64)
    pts = []
    for t in np.concatenate([[np.inf], np.unique(scores)]):
        pred = scores >= t
        pts.append((pred[labels == 0].mean(), pred[labels == 1].mean()))
    return pts


def tpr_at_fpr_ref(labels, scores, target):
    return max(t for f, t in operating_points(labels, scores) if f <= target)


def fpr_at_tpr_ref(labels, scores, target):
    return min(f for f, t in operating_points(labels, scores) if t >= target)


def random_case(seed, n=300, n_levels=None, shift=0.7):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    s = rng.normal(size=n) + shift * y
    if n_levels:  # many ties
        s = np.round(s * n_levels) / n_levels
    return y, s


CASES = [random_case(0), random_case(1, n_levels=2), random_case(2, n=57, n_levels=1),
         random_case(3, n=1000, shift=2.0), random_case(4, n=40, shift=-0.5)]


# ---------------------------------------------------------------- point metrics

@pytest.mark.parametrize("y,s", CASES)
def test_auroc_matches_mann_whitney(y, s):
    assert m.auroc(y, s) == pytest.approx(auroc_ref(y, s), abs=1e-12)
    assert m.auroc(y, s) == pytest.approx(roc_auc_score(y, np.asarray(s, np.float64)), abs=1e-12)


@pytest.mark.parametrize("y,s", CASES)
@pytest.mark.parametrize("target", [0.0, 0.001, 0.01, 0.05, 0.1, 0.3])
def test_tpr_at_fpr_matches_threshold_scan(y, s, target):
    assert m.tpr_at_fpr(y, s, target) == pytest.approx(tpr_at_fpr_ref(y, s, target), abs=1e-12)


@pytest.mark.parametrize("y,s", CASES)
def test_fpr_at_tpr_matches_threshold_scan(y, s):
    assert m.fpr_at_tpr(y, s, 0.95) == pytest.approx(fpr_at_tpr_ref(y, s, 0.95), abs=1e-12)


@pytest.mark.parametrize("y,s", CASES)
def test_best_balanced_accuracy_matches_scan(y, s):
    acc, thr = m.best_balanced_accuracy(y, s)
    ref = max((t + 1 - f) / 2 for f, t in operating_points(y, s))
    assert acc == pytest.approx(ref, abs=1e-12)
    pred = s >= thr  # the returned threshold achieves the returned accuracy
    assert ((pred[y == 1].mean() + (~pred[y == 0]).mean()) / 2) == pytest.approx(acc, abs=1e-12)


def test_tpr_at_fpr_is_conservative():
    # 10 non-members: FPR steps of 0.1, so a 5% budget allows zero false positives.
    y = np.array([0] * 10 + [1] * 10)
    s = np.arange(20.0)  # members (10..19) all above non-members (0..9) ...
    s[9] = 100.0  # ... except one non-member that outscores every member
    assert m.tpr_at_fpr(y, s, 0.05) == 0.0
    assert m.tpr_at_fpr(y, s, 0.1) == 1.0


def test_perfect_and_reversed_separation():
    y = np.array([0] * 50 + [1] * 50)
    s = np.arange(100.0)
    assert m.auroc(y, s) == 1.0
    assert m.tpr_at_fpr(y, s, 0.05) == 1.0
    assert m.tpr_at_fpr(y, s, 0.001) == 1.0
    assert m.fpr_at_tpr(y, s, 0.95) == 0.0
    assert m.best_balanced_accuracy(y, s) == (1.0, 50.0)
    assert m.auroc(y, -s) == 0.0
    assert m.tpr_at_fpr(y, -s, 0.05) == 0.0
    assert m.fpr_at_tpr(y, -s, 0.95) == 1.0
    r = m.evaluate(y, s, n_bootstrap=200)
    assert r["auroc"] == 1.0 and r["auroc_ci"] == [1.0, 1.0] and r["tpr_at_5pct_fpr_ci"] == [1.0, 1.0]


def test_roc_curve_shape():
    y, s = CASES[0]
    f, t, thr = m.roc_curve(y, s)
    assert f[0] == 0 and t[0] == 0 and np.isinf(thr[0])
    assert f[-1] == 1 and t[-1] == 1
    assert len(thr) == len(np.unique(s)) + 1  # no intermediate points dropped
    for y, s in CASES:  # every point, against scikit-learn's curve in float64
        f, t, thr = m.roc_curve(y, s)
        rf, rt, rthr = sklearn_roc_curve(y, np.asarray(s, np.float64), drop_intermediate=False)
        np.testing.assert_allclose(f, rf, rtol=0, atol=1e-12)
        np.testing.assert_allclose(t, rt, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(thr[1:], rthr[1:])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(-1e6, 1e6, allow_nan=False)), min_size=2, max_size=60,
                unique_by=lambda x: x[1]))
def test_negating_scores_flips_auroc(rows):
    y = np.array([int(a) for a, _ in rows])
    s = np.array([b for _, b in rows])
    if y.min() == y.max():
        return
    assert m.auroc(y, -s) == pytest.approx(1.0 - m.auroc(y, s), abs=1e-12)


# ---------------------------------------------------------------- input checking

@pytest.mark.parametrize("bad", [[0, 1, 2, 1], [0, 1, -1, 1], [0, 1, 0.5, 1], [0, 1, np.nan, 1]])
def test_bad_labels_raise_and_name_values(bad):
    with pytest.raises(ValueError, match="labels must be 0"):
        m.evaluate(bad, [0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError) as e:
        m.auroc(bad, [0.1, 0.2, 0.3, 0.4])
    bad_value = [v for v in bad if not (v == 0 or v == 1)][0]
    assert repr(bad_value) in str(e.value) or str(bad_value) in str(e.value)


def test_bool_and_float_labels_accepted():
    s = [0.1, 0.4, 0.35, 0.8]
    assert m.auroc([False, False, True, True], s) == m.auroc([0.0, 0.0, 1.0, 1.0], s) == 0.75


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="differ in length"):
        m.evaluate([0, 1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="differ in length"):
        m.auroc([0, 1], [0.1, 0.2, 0.3])


def test_low_level_functions_reject_nan_and_single_class():
    with pytest.raises(ValueError, match="NaN"):
        m.auroc([0, 1, 1], [0.1, np.nan, 0.3])
    with pytest.raises(ValueError, match="both classes"):
        m.tpr_at_fpr([1, 1], [0.1, 0.2], 0.05)


# ---------------------------------------------------------------- evaluate

EXPECTED_KEYS = {"n", "n_scored", "n_nan", "n_members", "n_nonmembers", "auroc", "auroc_ci",
                 "tpr_at_0.1pct_fpr", "tpr_at_1pct_fpr", "tpr_at_5pct_fpr", "tpr_at_5pct_fpr_ci",
                 "fpr_at_95pct_tpr", "best_balanced_accuracy", "best_threshold", "note"}


def test_evaluate_keys_values_and_json():
    y, s = random_case(7, n=800)
    r = m.evaluate(y, s, n_bootstrap=300)
    assert set(r) == EXPECTED_KEYS
    assert json.loads(json.dumps(r, allow_nan=False)) == r
    assert r["n"] == r["n_scored"] == 800 and r["n_nan"] == 0 and r["note"] is None
    assert r["n_members"] == int(y.sum()) and r["n_nonmembers"] == 800 - int(y.sum())
    assert r["auroc"] == pytest.approx(auroc_ref(y, s))
    assert r["tpr_at_5pct_fpr"] == pytest.approx(tpr_at_fpr_ref(y, s, 0.05))
    assert r["tpr_at_1pct_fpr"] == pytest.approx(tpr_at_fpr_ref(y, s, 0.01))
    assert r["tpr_at_0.1pct_fpr"] == pytest.approx(tpr_at_fpr_ref(y, s, 0.001))
    assert r["fpr_at_95pct_tpr"] == pytest.approx(fpr_at_tpr_ref(y, s, 0.95))


def test_evaluate_counts_and_excludes_nan_and_inf():
    y, s = random_case(8, n=200)
    bad = s.copy()
    bad[[3, 10, 50]] = np.nan
    bad[[20, 21]] = [np.inf, -np.inf]
    r = m.evaluate(y, bad, n_bootstrap=50)
    keep = np.isfinite(bad)
    assert (r["n"], r["n_scored"], r["n_nan"]) == (200, 195, 5)
    assert r["n_members"] + r["n_nonmembers"] == 195
    assert r["auroc"] == pytest.approx(auroc_ref(y[keep], s[keep]))
    assert "5 NaN/inf scores excluded" in r["note"]


def test_evaluate_single_class_gives_none_and_note():
    r = m.evaluate([1] * 387 + [0], [0.5] * 387 + [np.nan])
    assert r["n_members"] == 387 and r["n_nonmembers"] == 0 and r["n_nan"] == 1
    for k in EXPECTED_KEYS - {"n", "n_scored", "n_nan", "n_members", "n_nonmembers", "note"}:
        assert r[k] is None, k
    assert r["note"].startswith("AUROC undefined: only one class among scored examples "
                                "(387 members, 0 non-members)")
    assert "1 NaN/inf score excluded" in r["note"]
    json.dumps(r, allow_nan=False)


def test_evaluate_empty():
    r = m.evaluate([], [])
    assert r["n"] == 0 and r["auroc"] is None and "undefined" in r["note"]


def test_bootstrap_ci_seeded_and_contains_estimate():
    y, s = random_case(9, n=800, shift=0.5)
    r1 = m.evaluate(y, s, seed=1)
    r1b = m.evaluate(y, s, seed=1)
    r2 = m.evaluate(y, s, seed=2)
    assert r1["auroc_ci"] == r1b["auroc_ci"] and r1["tpr_at_5pct_fpr_ci"] == r1b["tpr_at_5pct_fpr_ci"]
    assert r1["auroc_ci"] != r2["auroc_ci"]
    for r in (r1, r2):
        lo, hi = r["auroc_ci"]
        assert lo < r["auroc"] < hi and hi - lo < 0.2
        lo, hi = r["tpr_at_5pct_fpr_ci"]
        assert lo <= r["tpr_at_5pct_fpr"] <= hi and lo < hi
    narrow = m.evaluate(y, s, seed=1, confidence=0.5)["auroc_ci"]
    assert r1["auroc_ci"][0] < narrow[0] < narrow[1] < r1["auroc_ci"][1]
    assert m.evaluate(y, s, n_bootstrap=0)["auroc_ci"] is None


def test_bootstrap_row_statistics_match_point_functions():
    rng = np.random.default_rng(10)
    for n_levels in (None, 3):
        y, s = random_case(int(rng.integers(1000)), n=120, n_levels=n_levels)
        pos, neg = s[y == 1], s[y == 0]
        for _ in range(5):
            p = rng.choice(pos, pos.size)[None]
            q = rng.choice(neg, neg.size)[None]
            yy = np.r_[np.ones(p.size), np.zeros(q.size)]
            ss = np.r_[p[0], q[0]]
            assert bs.auroc_rows(p, q)[0] == pytest.approx(m.auroc(yy, ss), abs=1e-12)
            for f in (0.0, 0.01, 0.05, 0.2, 1.0):
                assert bs.tpr_at_fpr_rows(p, q, f)[0] == pytest.approx(m.tpr_at_fpr(yy, ss, f), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 60), st.integers(1, 60), st.sampled_from([None, 2, 5]),
       st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0]))
def test_drawn_rows_equal_the_resampled_rows_to_the_bit(seed, n_pos, n_neg, n_levels, fpr):
    """``bootstrap.drawn_rows`` (multiplicities, one sort) gives exactly what ranking the materialised resamples
    gives (``auroc_rows``, ``tpr_at_fpr_rows``): ties (few score levels) and +-inf included; draws of another
    length than the class (as the cluster and subset bootstraps have) too."""
    rng = np.random.default_rng(seed)
    pos, neg = (rng.normal(size=k) for k in (n_pos, n_neg))
    if n_levels:
        pos, neg = np.round(pos * n_levels / 4), np.round(neg * n_levels / 4)
    pos[rng.random(n_pos) < 0.05], neg[rng.random(n_neg) < 0.05] = np.inf, -np.inf
    b = int(rng.integers(1, 40))
    ip = rng.integers(0, n_pos, (b, int(rng.integers(1, 2 * n_pos + 1))))
    iq = rng.integers(0, n_neg, (b, int(rng.integers(1, 2 * n_neg + 1))))
    auc, tpr = bs.drawn_rows(pos, neg, ip, iq, fpr)
    assert np.array_equal(auc, bs.auroc_rows(pos[ip], neg[iq]))
    assert np.array_equal(tpr, bs.tpr_at_fpr_rows(pos[ip], neg[iq], fpr))


def test_bootstrap_is_stratified_and_fast():
    # 795 members, 5 non-members: unstratified resamples would often have no non-member.
    y = np.r_[np.ones(795, int), np.zeros(5, int)]
    s = np.random.default_rng(11).normal(size=800)
    r = m.evaluate(y, s, n_bootstrap=1000, min_per_class=1)  # the resampling itself, below the reporting floor
    assert all(np.isfinite(r["auroc_ci"]))  # an unstratified resample without non-members would give NaN
    # the percentile interval of a brute-force stratified bootstrap (independent draws, 4000 resamples); an
    # unstratified one (NaNs dropped) gives about [0.31, 0.91] here
    rng = np.random.default_rng(123)
    pos, neg = s[y == 1], s[y == 0]
    p = pos[rng.integers(0, pos.size, (4000, pos.size))]
    q = neg[rng.integers(0, neg.size, (4000, neg.size))]
    ref = np.quantile((p[:, :, None] > q[:, None, :]).mean(axis=(1, 2)), [0.025, 0.975])
    assert r["auroc_ci"] == pytest.approx(ref, abs=0.02)


def test_evaluate_records_by_method_and_group():
    rng = np.random.default_rng(3)
    n = 40
    labels = [int(i % 2) for i in range(n)]
    a, b = rng.normal(size=n) + labels, rng.normal(size=n)
    records = [{"scores": {"a": float(a[i]), "b": None if i == 3 else float(b[i])}} for i in range(n)]
    got = m.evaluate_records(records, ["a", "b"], labels, n_bootstrap=20, seed=1)
    assert list(got) == ["a", "b"] and got["b"]["n_nan"] == 1
    assert got["a"] == m.evaluate(labels, a, n_bootstrap=20, seed=1)
    groups = ["x" if i < 10 else "y" for i in range(n)][::-1]
    by = m.evaluate_records(records, ["a"], labels, n_bootstrap=0, groups=groups)
    assert list(by) == ["y", "x"]
    assert by["x"]["a"] == m.evaluate(labels[30:], a[30:], n_bootstrap=0)
    np.testing.assert_array_equal(m.scores_by_method(records[2:4], ["b"])["b"], [b[2], np.nan])


def test_fewer_than_ten_per_class_is_na_with_the_reason():
    """A cell of 9 members is n/a (never a number, never bold), and so is a comparison on it; 10 is enough."""
    rng = np.random.default_rng(0)
    y9, s9 = np.r_[np.ones(9, int), np.zeros(40, int)], rng.normal(size=49)
    r = m.evaluate(y9, s9 + 3 * y9)
    assert r["auroc"] is None and r["auroc_ci"] is None and r["tpr_at_5pct_fpr"] is None
    assert "fewer than 10 examples per class (9 members, 40 non-members)" in r["note"]
    with pytest.raises(ValueError, match="fewer than 10 examples per class"):
        cmp.paired_bootstrap(y9, s9, -s9, n_bootstrap=20)
    mean = cmp.evaluate_mean(np.r_[y9, y9], np.r_[s9, s9], ["a"] * 49 + ["b"] * 49, n_bootstrap=20)
    assert mean["auroc"] is None and "a: n/a" in mean["note"]
    y10 = np.r_[np.ones(10, int), np.zeros(40, int)]
    assert m.evaluate(y10, rng.normal(size=50), n_bootstrap=20)["auroc"] is not None
    # NaN scores do not count: 10 members of which one is NaN leaves 9
    s = rng.normal(size=50)
    s[0] = np.nan
    assert m.evaluate(y10, s)["auroc"] is None

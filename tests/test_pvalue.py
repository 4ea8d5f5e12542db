"""The Monte-Carlo resolution of a bootstrap p (mia_jax.evaluation.pvalue) and the verdicts built on it
(comparisons.holm_adjust): the interval against scipy's exact binomial interval, the floor printed as "< 1/(B+1)"
wherever a p of 0 is printed, a comparison near 0.05 whose verdict no longer depends on the seed, resamples added
only where a verdict needs them, "undecided" at the most, and the seed audit naming a verdict that changes."""
import runpy
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from mia_jax.evaluation import comparisons as cmp
from mia_jax.evaluation import pvalue
from train import claims

REPO = Path(__file__).resolve().parents[1]


def near_threshold(seed: int = 68):
    """60 examples whose paired AUROC p sits near 0.05: with 2000 resamples it is 0.041 under seed 0 ("A > B") and
    0.059 under seed 2 (not distinguishable); with 100 000, 0.054. ``seed=126``: near 0.025 (0.021 with 2000, 0.027
    with 100 000), i.e. near 0.05 once doubled by Holm's correction as the second smallest of three."""
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(30, int), np.zeros(30, int)]
    a = labels * 0.5 + rng.normal(size=60)
    return labels, a, 0.6 * a + 0.8 * rng.normal(size=60)


def separated(seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(40, int), np.zeros(40, int)]
    return labels, labels * 3.0 + rng.normal(size=80), rng.normal(size=80)


@pytest.mark.parametrize("k, n", [(0, 2000), (1, 2000), (37, 2000), (520, 100_000), (1000, 2000)])
def test_p_interval_is_twice_the_exact_binomial_interval(k, n):
    ci = binomtest(k, n).proportion_ci(confidence_level=pvalue.MC_CONFIDENCE, method="exact")
    lo, hi = pvalue.p_interval(min(1.0, 2 * k / n), n)
    assert lo[0] == pytest.approx(min(1.0, 2 * ci.low), abs=1e-12)
    assert hi[0] == pytest.approx(min(1.0, 2 * ci.high), abs=1e-12)


def test_a_p_of_zero_prints_as_its_floor():
    """No resample crossed 0: the p printed is "< 1/(B+1)", never 0.000, in a report sentence and in the claims
    table."""
    assert pvalue.p_text(0.0, 2000) == "< 1/2001" and pvalue.p_text(0.0, 32000) == "< 1/32001"
    assert pvalue.p_text(0.0004, 2000) == "< 0.001" and pvalue.p_text(0.0123, 2000) == "0.012"
    assert pvalue.p_text(None, 2000) == "n/a" and pvalue.p_text(float("nan"), 2000) == "n/a"
    labels, a, b = separated()
    c = cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=0)
    assert c["auroc"]["p"] == 0.0
    cmp.holm_adjust([c])
    said = cmp.describe(c, "a", "b")
    assert "Holm-adjusted p < 1/2001 of 1" in said and "0.000 of" not in said
    claim = claims.make_claim("a > b", "", cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=0), "a", "b")
    claims.correct([claim])
    row = claims.claims_markdown([claim]).splitlines()[-1]
    assert "| < 1/2001 |" in row and "0.000" not in row.split("|")[7]


def test_a_verdict_near_the_threshold_does_not_depend_on_the_seed():
    """At 2000 resamples the verdict flips with the seed; corrected by holm_adjust (resampling more near 0.05), every
    seed gives the same verdict, or "undecided"."""
    labels, a, b = near_threshold()
    plain = {cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=s)["auroc"]["verdict"] for s in range(3)}
    assert plain == {"A > B", "not distinguishable"}  # the case really is at the edge
    verdicts = []
    for s in range(3):
        c = cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=s)
        cmp.holm_adjust([c])
        verdicts.append(c["auroc"]["verdict"])
        assert cmp.resamples(c) > 2000 and c["auroc"]["n_bootstrap"] <= pvalue.MAX_RESAMPLES
    decided = set(verdicts) - {"undecided"}
    assert len(decided) <= 1 and verdicts.count("undecided") < len(verdicts), verdicts


def test_resamples_are_added_only_where_a_verdict_needs_them():
    """A family of a clear difference, a null (two rank-identical scores) and one near the threshold: only the last
    is recomputed with more resamples (its AUROC metric, with its count); the others keep their 2000 and their very
    numbers; applying the correction again changes nothing."""
    labels, a, b = near_threshold(126)
    lab2, a2, b2 = separated(1)
    fam = [cmp.paired_bootstrap(lab2, a2, b2, n_bootstrap=2000, seed=0),
           cmp.paired_bootstrap(labels, a, np.exp(a), n_bootstrap=2000),  # rank-identical: p = 1
           cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=0)]
    before = [dict(c["auroc"]) for c in fam]
    cmp.holm_adjust(fam)
    assert [cmp.resamples(c) for c in fam[:2]] == [2000, 2000]
    assert all(c["auroc"][k] == v for c, b_ in zip(fam[:2], before) for k, v in b_.items())
    assert cmp.resamples(fam[2]) > 2000 and cmp.resamples(fam[2], "tpr_at_5pct_fpr") == 2000
    assert fam[2]["auroc"]["p"] == cmp.paired_bootstrap(labels, a, b, n_bootstrap=cmp.resamples(fam[2]))["auroc"]["p"]
    assert [c["auroc"]["verdict"] for c in fam[:2]] == ["A > B", "not distinguishable"]
    again = [dict(c["auroc"]) for c in fam]
    cmp.holm_adjust(fam)
    assert [c["auroc"] for c in fam] == again


def test_undecided_at_the_most_resamples(monkeypatch):
    """A p whose Monte-Carlo interval still straddles 0.05 at the most resamples allowed is "undecided", said so in
    the report's sentence with the interval."""
    monkeypatch.setattr(pvalue, "MAX_RESAMPLES", 4000)
    labels, a, b = near_threshold()
    c = cmp.paired_bootstrap(labels, a, b, n_bootstrap=2000, seed=0)
    cmp.holm_adjust([c])
    lo, hi = c["auroc"]["p_holm_interval"]
    assert cmp.resamples(c) == 4000 and lo < 0.05 <= hi and c["auroc"]["verdict"] == "undecided"
    assert "a vs b: undecided (" in cmp.describe(c, "a", "b") and "straddling 0.05" in cmp.describe(c, "a", "b")
    assert cmp.tied_with_best({"best": "a", "vs": {"b": c}}) == {"a", "b"}  # not shown below the best: bold


def test_seed_audit_names_a_verdict_that_changes():
    """build_results' seed audit redoes each comparison with the seed shifted and names a verdict that changes (another
    verdict stated under another seed); one undecided under some seeds only is listed apart, as no seed contradicts
    it."""
    audit = runpy.run_path(str(REPO / "scripts" / "build_results.py"), run_name="_script_build_results")["seed_audit"]

    def fake(seed: int, p_other: float) -> cmp.Comparison:
        p = 0.001 if seed == 0 else p_other
        ci = [0.01, 0.1] if p < 0.05 else [-0.1, 0.1]
        c = cmp.Comparison(n_bootstrap=100_000, seed=seed, confidence=0.95, auroc={
            "a": 0.7, "b": 0.6, "diff": 0.1, "ci": ci, "verdict": cmp.verdict(ci), "p": p})
        c.redo = lambda n, s: fake(s, p_other)
        return c

    # other seeds: p 0.5 (stated: not distinguishable), the same p, a p whose interval straddles 0.05 once doubled
    fam = [fake(0, 0.5), fake(0, 0.001), fake(0, 0.025)]
    log = {"families": [("auroc", None, fam)]}
    cmp.holm_adjust(fam)
    n, changed, undecided = audit(log, range(1, 3))
    assert n == 3 and len(changed) == 1 and len(undecided) == 1
    assert changed[0].startswith("A > B -> not distinguishable, not distinguishable (a family of 3)")
    assert undecided[0].startswith("A > B -> undecided, undecided")


def test_a_column_grows_in_one_bootstrap_with_the_pairwise_numbers():
    """The methods of a compare_to_best column recomputed together (``batch``) or alone (``redo``) get the numbers
    of their pairwise paired_bootstrap with the best, at any count of resamples and seed."""
    labels, a, b = near_threshold()
    scores = {"a": a, "b": b, "c": 0.5 * a + np.random.default_rng(1).normal(size=60)}
    entry = cmp.compare_to_best(labels, scores, {"a": 0.8, "b": 0.6, "c": 0.7}, n_bootstrap=2000, seed=0)
    run, _ = entry["vs"]["b"].batch
    together = run(("b", "c"), 4000, 3)
    for m in ("b", "c"):
        pairwise = cmp.paired_bootstrap(labels, a, scores[m], n_bootstrap=4000, seed=3)
        assert together[m]["auroc"] == pairwise["auroc"] == entry["vs"][m].redo(4000, 3)["auroc"]
        assert entry["vs"][m].redo(2000, 5)["auroc"] == cmp.paired_bootstrap(labels, a, scores[m], n_bootstrap=2000,
                                                                             seed=5)["auroc"]


def test_auroc_only_skips_the_resampled_tprs_and_keeps_the_aurocs():
    """``bootstrap.auroc_only()`` (what holm_adjust wraps an AUROC comparison's recomputation in): the same resampled
    AUROCs to the bit, every resampled TPR NaN (not computed); outside it both are computed again."""
    from mia_jax.evaluation import bootstrap

    labels, a, b = near_threshold()
    whole = cmp.paired_bootstrap(labels, a, b, n_bootstrap=3000, seed=4)
    with bootstrap.auroc_only():
        quick = cmp.paired_bootstrap(labels, a, b, n_bootstrap=3000, seed=4)
    assert quick["auroc"] == whole["auroc"]
    assert np.isnan(quick["tpr_at_5pct_fpr"]["ci"]).all() and np.isfinite(whole["tpr_at_5pct_fpr"]["ci"]).all()
    again = cmp.paired_bootstrap(labels, a, b, n_bootstrap=3000, seed=4)
    assert again["tpr_at_5pct_fpr"] == whole["tpr_at_5pct_fpr"]

"""Verdicts that survive multiplicity and another seed: Holm's adjusted p-values against a float64 reference written
from the definition (statsmodels' ``multipletests(method="holm")`` semantics) and a hand-worked case, the bootstrap
p-value against its interval, ``holm_adjust`` on a table's comparisons, the runner-up that is not rank-identical,
the claims' correction and seed re-test, and the one formatter's rounding of ties (0.7325 prints 0.733 wherever it
comes from)."""
import itertools
import runpy
from pathlib import Path

import numpy as np
import pytest

from mia_jax.evaluation import comparisons as cmp
from mia_jax.evaluation import report, rounding, verdict_log
from train import claims


def holm_reference(p):
    """Holm's step-down adjusted p-values from the definition, one at a time in float64: for the i-th smallest,
    max over j <= i of min(1, (m - j + 1) p_(j)) (1-based), i.e. statsmodels' multipletests(p, method="holm")[1]."""
    p = [float(x) for x in p]
    m = len(p)
    order = sorted(range(m), key=lambda i: (p[i], i))
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def test_holm_hand_worked_case():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06 (running max of 0.06), 0.06
    assert cmp.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06], abs=1e-15)
    # capped at 1, ties keep their order, an empty family is empty
    assert cmp.holm([0.5, 0.5, 0.001]).tolist() == pytest.approx([1.0, 1.0, 0.003])
    assert cmp.holm([]).size == 0


@pytest.mark.parametrize("seed", range(5))
def test_holm_matches_the_definition(seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 0.2, size=rng.integers(1, 40))
    p[rng.integers(0, p.size, size=3) % p.size] = 0.0  # bootstrap p-values can be exactly 0
    assert cmp.holm(p) == pytest.approx(holm_reference(p), abs=1e-15)


def test_bootstrap_p_and_its_interval_agree():
    """p < 0.05 exactly when too few resampled differences sit on the other side of 0 for the 95% percentile
    interval to reach 0: every such p comes with an interval that excludes 0."""
    rng = np.random.default_rng(0)
    for shift in np.linspace(0, 0.3, 31):
        d = rng.normal(shift, 0.1, size=2000)
        p = cmp.bootstrap_p(d)
        assert p == pytest.approx(min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean())))
        lo, hi = np.quantile(d, [0.025, 0.975])
        if p < 0.05:
            assert lo > 0 or hi < 0
    assert cmp.bootstrap_p(np.zeros(10)) == 1.0 and cmp.bootstrap_p(np.array([])) == 1.0


def _comparison(p, ci, verdict):
    return {"confidence": 0.95, "n_bootstrap": 100_000, "auroc": {"p": p, "ci": ci, "verdict": verdict}}


def test_holm_adjust_withdraws_what_multiplicity_does_not_support():
    fam = [_comparison(0.001, [0.1, 0.2], "A > B"), _comparison(0.02, [0.01, 0.1], "A > B"),
           _comparison(0.03, [-0.1, -0.01], "B > A"), None, _comparison(0.5, [-0.1, 0.1], "not distinguishable")]
    assert cmp.holm_adjust(fam) == 4
    got = [(c["auroc"]["verdict"], c["auroc"]["verdict_unadjusted"], c["auroc"]["p_holm"]) for c in fam if c]
    assert got == [("A > B", "A > B", pytest.approx(0.004)), ("not distinguishable", "A > B", pytest.approx(0.06)),
                   ("not distinguishable", "B > A", pytest.approx(0.06)),
                   ("not distinguishable", "not distinguishable", pytest.approx(0.5))]
    again = [dict(c, auroc=dict(c["auroc"])) for c in fam if c]
    cmp.holm_adjust(again)  # applied twice to the same family: the same verdicts
    assert [c["auroc"]["verdict"] for c in again] == [g[0] for g in got]


def test_paired_comparisons_carry_their_p_and_the_family_corrects_them():
    rng = np.random.default_rng(3)
    labels = np.r_[np.ones(60, int), np.zeros(60, int)]
    strong = labels * 1.5 + rng.normal(size=120)
    fam = [cmp.paired_bootstrap(labels, strong, rng.normal(size=120) + 0.3 * labels, n_bootstrap=cmp.VERDICT_RESAMPLES,
                                seed=s) for s in range(3)]
    assert all(c["n_bootstrap"] >= 2000 and 0 <= c["auroc"]["p"] <= 1 for c in fam)
    cmp.holm_adjust(fam)
    for c in fam:
        assert c["auroc"]["p_holm"] >= c["auroc"]["p"]
        assert "Holm-adjusted p" in cmp.describe(c, "a", "b")
    assert cmp.verdict_resamples(1000) == 2000 and cmp.verdict_resamples(5000) == 5000


def test_runner_up_is_the_best_method_that_ranks_differently():
    """Loss and PPL order every text alike (PPL = exp(-Loss) per text, so every AUROC is equal): PPL is the best again
    under another name, never the runner-up the best is compared with."""
    rng = np.random.default_rng(1)
    labels = np.r_[np.ones(40, int), np.zeros(40, int)]
    loss = labels + rng.normal(size=80)
    scores = {"loss": loss, "ppl": -np.exp(-loss), "zlib": 0.5 * labels + rng.normal(size=80)}
    scores["ppl"] = np.exp(loss)  # monotone in loss: rank-identical
    points = {"loss": 0.8, "ppl": 0.8, "zlib": 0.6}
    entry = cmp.compare_to_best(labels, scores, points, n_bootstrap=200, seed=0)
    assert entry["best"] == "loss" and entry["vs"]["ppl"]["auroc"]["ci"] == [0.0, 0.0]
    name, comp = cmp.runner_up(entry)
    assert name == "zlib" and comp is entry["vs"]["zlib"]
    assert cmp.runner_up({"best": "loss", "vs": {"ppl": entry["vs"]["ppl"]}}) is None


def _claim_comparison(p: float, diff: float) -> cmp.Comparison:
    """A paired comparison as the claims read it (100 000 resamples: every p below far from 0.05 is decided)."""
    ci = [diff - 0.05, diff + 0.05]
    return cmp.Comparison(n_used=200, n_bootstrap=100_000, seed=0, confidence=0.95, auroc={
        "a": 0.7, "b": 0.7 - diff, "a_ci": [0.6, 0.8], "b_ci": [0.6, 0.8], "diff": diff, "ci": ci,
        "verdict": cmp.verdict(ci), "p": p})


def test_claims_correction_and_seed_stability():
    """The claims are Holm-corrected by comparisons.holm_adjust on their comparisons (one rule), each row refreshed
    from its comparison."""
    found = [claims.make_claim(f"c{i}", "", _claim_comparison(p, d), "A", "B") for i, (p, d) in
             enumerate([(0.001, 0.2), (0.04, 0.1), (0.0, -0.3), (0.3, 0.0)])]
    found.append(claims.make_claim("na", "", "too few", "A", "B"))
    assert claims.correct(found) == 4  # adjusted: 0.003, 0.08, 0, 0.3
    assert [c["verdict"] for c in found] == ["reproduced", "not distinguishable", "not reproduced",
                                             "not distinguishable", claims.NA]
    assert [c.get("p_holm") for c in found] == [pytest.approx(0.003), pytest.approx(0.08), 0.0, pytest.approx(0.3),
                                                None]
    assert found[1]["verdict_unadjusted"] == "reproduced"
    assert found[1].comparison["auroc"]["p_holm"] == found[1]["p_holm"]
    other = [dict(c) for c in found]
    other[0]["verdict"] = "not distinguishable"
    st = claims.seed_stability(found, [found, other])
    assert st == {"same": 3, "of": 4, "seeds": 2, "changed": ["c0"], "undecided": []}
    assert found[0]["other_seeds"] == {"same": 1, "of": 2, "verdicts": {"reproduced": 1, "not distinguishable": 1}}
    other[0]["verdict"] = other[1]["verdict"] = "undecided"  # states nothing: contradicts no verdict
    st = claims.seed_stability(found, [found, other])
    assert st["changed"] == [] and st["undecided"] == ["c0", "c1"] and found[1]["other_seeds"]["same"] == 2


@pytest.mark.parametrize("value, want", [(0.7325, "0.733"), (0.73249999999999993, "0.733"), (0.7324999, "0.732"),
                                         (0.0005, "0.001"), (1.0, "1.000"), (None, "n/a"), (float("nan"), "n/a")])
def test_one_rounding_for_every_table(value, want):
    """The IMDB Min-K% AUROC reached as a rank sum (0.7325) and as a trapezoid (one ulp below) prints once."""
    assert rounding.fmt(value) == report.fmt(value) == want


def test_signed_rounding_and_intervals():
    assert rounding.fmt(-0.0001, sign=True) == "-0.000" and rounding.fmt(0.0, sign=True) == "+0.000"
    assert rounding.fmt(-0.0325, sign=True) == "-0.033" and rounding.fmt(37.405, 2) == "37.41"
    assert rounding.diff_ci(0.17949999999999999, [0.1465, 0.2125]) == "+0.180 [+0.147, +0.213]"
    assert report.with_ci(0.7325, [0.66449999999999998, 0.7995]) == "0.733 [0.665, 0.800]"
    for a, b in itertools.combinations([0.7325, 0.73249999999999993, 0.7325000000000001], 2):
        assert rounding.fmt(a) == rounding.fmt(b)


def test_seed_audit_recomputes_each_family_under_other_seeds():
    """Inside verdict_log.recording(), every Holm family is recorded with its comparisons; build_results' seed audit
    recomputes them with the seed shifted (``redo``: the same numbers as calling with that seed) and Holm again."""
    audit = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "build_results.py"),
                           run_name="_script_build_results")["seed_audit"]
    rng = np.random.default_rng(2)
    labels = np.r_[np.ones(40, int), np.zeros(40, int)]
    a, b = labels * 1.2 + rng.normal(size=80), rng.normal(size=80)
    with verdict_log.recording() as log:
        entry = cmp.compare_to_best(labels, {"a": a, "b": b, "c": b + 0.01 * rng.normal(size=80)},
                                    {"a": 0.8, "b": 0.5, "c": 0.5}, n_bootstrap=300, seed=4)
        cmp.holm_adjust(list(entry["vs"].values()))
    assert not verdict_log.active() and len(log["families"]) == 1
    again = entry["vs"]["b"].redo(300, 7)  # each comparison knows how to recompute itself with another seed
    assert again["auroc"]["ci"] == cmp.paired_bootstrap(labels, a, b, n_bootstrap=300, seed=7)["auroc"]["ci"]
    n, changed, undecided = audit(log, range(1, 3))
    assert n == 2 and changed == [] == undecided  # a clear difference keeps its verdict under every seed

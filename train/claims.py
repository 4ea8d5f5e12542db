"""The paper's claims (Shi et al. 2023, section 6) tested on the contamination sweeps, each a paired bootstrap of
A - B on the same examples (at least ``comparisons.VERDICT_RESAMPLES`` resamples), marked reproduced / not
reproduced / not distinguishable after Holm's correction over all the study's claims (:func:`correct`), and
re-tested under other bootstrap seeds (:func:`other_seed`, train/study.py's report)."""
from __future__ import annotations

import contextlib
import re

import numpy as np

from mia_jax.evaluation import comparisons, metrics, rounding
from mia_jax.evaluation.pvalue import p_text
from mia_jax.evaluation.report import markdown, with_ci
from train.cells import DATASET_NAMES, headline, method_name
from train.records import same_examples, score_vector
from train.sweep_tables import group_scores

VERDICT = {"A > B": "reproduced", "B > A": "not reproduced", "not distinguishable": "not distinguishable",
           "undecided": "undecided"}
NA = "n/a"  # the verdict of a claim with no comparison (a class with fewer than metrics.MIN_PER_CLASS examples)


class Claim(dict):
    """One row of the claims table (a JSON-serialisable dict) that keeps the comparison behind it (``comparison``,
    None for an n/a claim): :func:`correct` Holm-corrects the comparisons and refreshes the rows from them."""

    comparison: dict | None = None


def _fields(comp: dict) -> dict:
    """The row fields read off a paired comparison's AUROC (after :func:`correct`: its adjusted p, its Monte-Carlo
    interval and its resamples, more than the run's where the p lay near 0.05)."""
    c = comp["auroc"]
    out = {"auroc_a": c["a"], "auroc_a_ci": c["a_ci"], "auroc_b": c["b"], "auroc_b_ci": c["b_ci"], "diff": c["diff"],
           "ci": c["ci"], "verdict": VERDICT[c["verdict"]], "p": c["p"], "n_used": comp["n_used"],
           "n_bootstrap": comparisons.resamples(comp), "seed": comp["seed"]}
    if "p_holm" in c:
        out.update(p_holm=c["p_holm"], p_holm_interval=c["p_holm_interval"], family=c["family"],
                   verdict_unadjusted=VERDICT[c["verdict_unadjusted"]])
    return out


def make_claim(name: str, paper: str, comp: dict | str, a: str, b: str) -> Claim:
    """One row of the claims table: the claim ``name``, what the ``paper`` says, the sides ``a`` / ``b`` and the
    AUROC comparison ``comp`` (a paired-bootstrap result, kept as the row's ``comparison``, or a string: the reason
    there is none)."""
    if isinstance(comp, str):  # the reason there is no comparison
        return Claim(claim=name, paper=paper, a=a, b=b, auroc_a=None, auroc_a_ci=None, auroc_b=None,
                     auroc_b_ci=None, diff=None, ci=None, verdict=NA, note=comp)
    out = Claim(claim=name, paper=paper, a=a, b=b, **_fields(comp))
    out.comparison = comp
    return out


_SEED = {"offset": 0}  # added to every run's bootstrap seed inside other_seed()


@contextlib.contextmanager
def other_seed(offset: int):
    """Every claim computed inside draws its resamples with the run's seed + ``offset`` (the study's re-test of its
    verdicts under other seeds)."""
    _SEED["offset"] = offset
    try:
        yield
    finally:
        _SEED["offset"] = 0


def claim_resamples(run: dict) -> tuple[int, int]:
    """(resamples, seed) of a claim: the run's score.n_bootstrap, at least comparisons.VERDICT_RESAMPLES; its seed
    (plus the offset of :func:`other_seed`)."""
    score = run["config"]["score"]
    return (comparisons.verdict_resamples(int(score.get("n_bootstrap", 1000)) or 1000),
            int(score.get("seed", 0)) + _SEED["offset"])


def correct(claims: list[dict], alpha: float = 0.05) -> int:
    """Holm's correction over the study's ``claims`` (one family: every claim with a comparison), in place:
    :func:`comparisons.holm_adjust` on their comparisons (the one rule, resampling more where the adjusted p lies near
    ``alpha``), then each row refreshed from its comparison: ``p_holm``, ``p_holm_interval``, ``family``,
    ``verdict_unadjusted`` (the 95% interval's own verdict) and ``verdict``. Returns the family's size."""
    family = [c for c in claims if c["verdict"] != NA]
    comparisons.holm_adjust([c.comparison for c in family], "auroc", alpha)
    for c in family:
        c.update(_fields(c.comparison))
    return len(family)


def seed_stability(claims: list[dict], others: list[list[dict]]) -> dict:
    """How many of ``claims``' verdicts (corrected) are the same under every list of ``others`` (the same claims,
    corrected, under other seeds; "undecided" contradicts no verdict: ``comparisons.consistent``), in place: each
    claim's ``other_seeds`` ({"same": n, "of": m, "verdicts": {verdict: how many other seeds gave it}}); returns
    {"same": claims kept under all, "of": claims with a verdict, "seeds": m, "changed": [claim names], "undecided":
    [names of the kept ones undecided under some seeds but not all]}."""
    stated = [c for c in claims if c["verdict"] != NA]
    changed, undecided = [], []
    for c in stated:
        verdicts = [next(o["verdict"] for o in other if o["claim"] == c["claim"]) for other in others]
        same = sum(comparisons.consistent(v, c["verdict"]) for v in verdicts)
        c["other_seeds"] = {"same": same, "of": len(verdicts),
                            "verdicts": {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}}
        if same < len(verdicts):
            changed.append(c["claim"])
        elif set(verdicts) != {c["verdict"]}:
            undecided.append(c["claim"])
    return {"same": len(stated) - len(changed), "of": len(stated), "seeds": len(others), "changed": changed,
            "undecided": undecided}


def _paired(rows_a, rows_b, model_a, model_b, m_a, m_b, n_bootstrap, seed, dataset=None) -> dict | str:
    """The paired bootstrap of A - B, or the reason it is n/a (a class with fewer than metrics.MIN_PER_CLASS
    examples, in a dataset for the average)."""
    idx = [i for i, r in enumerate(rows_a) if dataset is None or r["dataset"] == dataset]
    lab = np.array([rows_a[i]["label"] for i in idx])
    a = score_vector([rows_a[i] for i in idx], model_a, m_a)
    b = score_vector([rows_b[i] for i in idx], model_b, m_b)
    groups = None if dataset is not None else [rows_a[i]["dataset"] for i in idx]
    try:
        return metrics.paired_bootstrap(lab, a, b, groups=groups, n_bootstrap=n_bootstrap, seed=seed)
    except ValueError as e:
        return str(e).replace("n/a: ", "")


def table3_claims(run: dict, tag: str = "") -> list[dict]:
    """The Table 3 claims of ``run`` (a loaded run): Min-K% beats each baseline on average, each a paired bootstrap;
    ``tag`` suffixes their names."""
    rows, methods = run["examples"], run["methods"]
    mk = headline(methods, "min_k")
    out = []
    for base, label in (("ppl", "PPL"), ("zlib", "Zlib"), ("lowercase", "Lowercase"), ("neighbor", "Neighbor")):
        if mk is None or base not in methods:
            continue
        comp = _paired(rows, rows, "trained", "trained", mk, base, *claim_resamples(run))
        out.append(make_claim(f"Table 3{tag}: Min-K% > {label} (average over datasets)", "reproduced in the paper",
                              comp, method_name(mk), label))
    return out


def lr_claims(runs: list[tuple[str, dict]], tag: str = "") -> list[dict]:
    """The Table 4 claims of the lr sweep ``runs`` ((sub-folder, run) pairs): Min-K% on the highest lr's trained
    model beats the lowest's, on average and per dataset; [] without two comparable runs."""
    by_lr = sorted(runs, key=lambda r: r[1]["config"]["train"]["lr"])
    lo, hi = by_lr[0][1], by_lr[-1][1]
    if len(by_lr) < 2 or not same_examples(lo["examples"], hi["examples"]):
        return []
    mk = headline(hi["methods"], "min_k")
    lr_hi, lr_lo = hi["config"]["train"]["lr"], lo["config"]["train"]["lr"]
    out = []
    for d in [None, *dict.fromkeys(r["dataset"] for r in hi["examples"])]:
        comp = _paired(hi["examples"], lo["examples"], "trained", "trained", mk, mk, *claim_resamples(hi), dataset=d)
        where = "average" if d is None else DATASET_NAMES.get(d, d)
        out.append(make_claim(f"Table 4{tag}: lr {lr_hi:g} > lr {lr_lo:g}, Min-K%, {where}", "every dataset", comp,
                              f"lr {lr_hi:g}", f"lr {lr_lo:g}"))
    return out


def size_claim(runs: list[tuple[str, dict]], figure: str, larger_is_easier: bool, tag: str = "") -> list[dict]:
    """The size claim of ``figure``'s sweep ``runs`` ((sub-folder, run) pairs): the largest corpus easier
    (``larger_is_easier``) or harder than the smallest; [] without two comparable runs."""
    by_size = sorted(runs, key=lambda r: r[1]["corpus"]["tokens"]["total"])
    small, large = by_size[0][1], by_size[-1][1]
    if len(by_size) < 2 or not same_examples(small["examples"], large["examples"]):
        return []
    mk = headline(large["methods"], "min_k")
    a, b = (large, small) if larger_is_easier else (small, large)
    comp = _paired(a["examples"], b["examples"], "trained", "trained", mk, mk, *claim_resamples(large))
    tok = {id(r): r["corpus"]["tokens"]["total"] for r in (small, large)}
    name = (f"{figure}{tag}: Min-K% AUROC, {tok[id(a)]:,} > {tok[id(b)]:,} corpus tokens (average)")
    return [make_claim(name, "larger corpus easier" if larger_is_easier else "larger corpus harder", comp,
                       f"{tok[id(a)]:,} tokens", f"{tok[id(b)]:,} tokens")]


def occurrence_claim(run: dict, tag: str = "") -> list[dict]:
    """The Figure 5c claim of ``run``: members inserted the most times are easier than those inserted once (a subset
    bootstrap); [] with one occurrence count."""
    rows, methods = run["examples"], run["methods"]
    mk = headline(methods, "min_k")
    idx, sc = group_scores([{"scores": r["trained"]} for r in rows], rows, [mk], "all")
    occ = np.array([rows[i].get("occurrences", 0) for i in idx])
    lab = np.array([rows[i]["label"] for i in idx])
    ks = sorted(set(occ[lab == 1].tolist()))
    if len(ks) < 2:
        return []
    n_bootstrap, seed = claim_resamples(run)
    try:
        comp = metrics.subset_bootstrap(sc[mk], lab, (lab == 1) & (occ == ks[-1]), (lab == 1) & (occ == 1),
                                        n_bootstrap=n_bootstrap, seed=seed)
    except ValueError as e:
        comp = str(e).replace("n/a: ", "")
    return [make_claim(f"Figure 5c{tag}: Min-K% AUROC, k = {ks[-1]} > k = 1 (pooled after rank normalisation)",
                       "more occurrences easier", comp, f"k={ks[-1]}", "k=1")]


def claims_markdown(claims: list[dict]) -> str:
    """``claims`` as a Markdown table (the verdict in bold when stated, n/a with its reason; the Holm-adjusted p and
    the verdict under the other seeds beside it when known)."""
    header = ["Claim", "A", "B", "AUROC A [95% CI]", "AUROC B [95% CI]", "A - B [95% CI]", "Holm p", "Verdict",
              "Same under other seeds"]
    rows = []
    for c in claims:
        if c["verdict"] == NA:  # no comparison: n/a with the reason, never bold
            rows.append([c["claim"], c["a"], c["b"], "n/a", "n/a", "n/a", "n/a", f"n/a ({c['note']})", "n/a"])
            continue
        seeds = c.get("other_seeds")
        rows.append([c["claim"], c["a"], c["b"], with_ci(c["auroc_a"], c["auroc_a_ci"]),
                     with_ci(c["auroc_b"], c["auroc_b_ci"]), rounding.diff_ci(c["diff"], c["ci"]),
                     p_text(c.get("p_holm"), c["n_bootstrap"]), f"**{c['verdict']}**",
                     "n/a" if seeds is None else f"{seeds['same']} of {seeds['of']}" + (
                         "" if set(seeds["verdicts"]) <= {c["verdict"]} else
                         " (" + ", ".join(f"{v} {n}" for v, n in seeds["verdicts"].items()) + ")")])
    return markdown(header, rows)


def lr_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """A learning-rate sweep's part of the report (Table 3 of its highest learning rate, from ``outputs``: its
    rebuilt files) and its claims (Table 3 and Table 4)."""
    main = max(runs, key=lambda r: r[1]["config"]["train"]["lr"])
    return [outputs[f"{main[0]}/table3.md"]], table3_claims(main[1], tag) + lr_claims(runs, tag)


def size_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """A background-size sweep's claim (Figure 5a: a larger corpus is easier); no part of its own."""
    return [], size_claim(runs, "Figure 5a", larger_is_easier=True, tag=tag)


def news_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """A news sweep's claim (Figure 5b: a larger corpus is harder); no part of its own."""
    return [], size_claim(runs, "Figure 5b", larger_is_easier=False, tag=tag)


def occurrence_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """An occurrence sweep's claim (Figure 5c: more occurrences are easier); no part of its own."""
    return [], occurrence_claim(runs[0][1], tag)


_T3 = re.compile(r"^Table 3 \((?P<model>[^)]*)\): Min-K% > (?P<base>\w+) \(average over datasets\)$")
_T4 = re.compile(r"^Table 4 \((?P<model>[^)]*)\): lr \S+ > lr \S+, Min-K%, (?P<where>.+)$")


def _stated(c: dict) -> str:
    return f"{c['verdict']}, {rounding.diff_ci(c['diff'], c['ci'])}" if c["verdict"] != NA else f"n/a ({c['note']})"


def across_models(found: list[dict]) -> str:
    """What holds across the models of a learning-rate sweep run on several (claims tagged with the model): the
    Table 4 average with whether every dataset kept its verdict, and each Table 3 claim per model; '' with one
    model."""
    t4: dict = {}
    t3: dict = {}
    for c in found:
        if m := _T4.match(c["claim"]):
            t4.setdefault(m["model"], {})[m["where"]] = c
        elif m := _T3.match(c["claim"]):
            t3.setdefault(m["base"], {})[m["model"]] = c
    if len(t4) < 2:
        return ""
    lr = []
    for model, by_where in t4.items():
        rest = [c["verdict"] for w, c in by_where.items() if w != "average"]
        same = "every dataset " + rest[0] if rest and len(set(rest)) == 1 else "datasets: " + ", ".join(
            f"{w} {c['verdict']}" for w, c in by_where.items() if w != "average")
        lr.append(f"{model}: {_stated(by_where['average'])} ({same})" if "average" in by_where else model)
    t3_said = [f"Min-K% > {base}: " + "; ".join(f"{model} {_stated(c)}" for model, c in by_model.items())
               for base, by_model in t3.items()]
    return ("the learning-rate effect (Table 4, Min-K% average, highest vs lowest lr) "
            + "; ".join(lr) + ". Table 3 (average over datasets): " + ". ".join(t3_said) + ".")

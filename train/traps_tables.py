"""The copyright-trap study's tables and figure (train/traps.py; ``python train/contaminate.py --ablation traps``),
from the run's per-example scores alone (``python -m train.tables --from DIR`` rebuilds them):

* ``traps.md`` / ``traps.csv``: the blind baseline with its interval (members and non-members come from the same
  generator and strata, so it is ~0.5 by construction); AUROC [95% CI] per number of insertions (members inserted
  k times against every non-member, lengths and bins pooled) for every detector, the reference-model ratio (an
  oracle: it needs the model before training) apart; the paired verdict k = max vs k = 1 for Loss and Min-K%
  (``metrics.subset_bootstrap``: the same non-members); and every (insertions, perplexity bin, length) cell:
  the members of the cell against the non-members of its (length, bin) stratum.
* ``traps.png``: AUROC against insertions (log scale) per detector, with the intervals.

A cell has far fewer members than ``metrics.MIN_PER_CLASS``: its AUROC and interval are shown (computed with the
cell's own count as the minimum) and no verdict is drawn from it; the table says so.
"""
from __future__ import annotations

import numpy as np

from mia_jax.evaluation import comparisons, metrics
from mia_jax.evaluation.report import csv_bytes, figure_bytes, markdown, pyplot
from train.cells import ORACLE, ci_cell, headline, method_name, na, num, rebuild_line
# the claims' own constructor and (resamples, seed) rule, other_seed's offset included: the trap claims are
# Holm-corrected and re-tested under other seeds with the study's other claims (train/study.py)
from train.claims import claim_resamples, make_claim
from train.records import score_vector
from train.traps import parse_stratum

VERDICT_METHODS = ("loss", "min_k")  # the acceptance's paired verdicts, k = max vs k = 1


def _setup(rows: list[dict]) -> dict:
    lab = np.array([r["label"] for r in rows])
    occ = np.array([r.get("occurrences", 0) for r in rows])
    strata = [parse_stratum(r["stratum"]) for r in rows]
    return {"lab": lab, "occ": occ, "length": np.array([s[0] for s in strata]),
            "bin": np.array([s[1] for s in strata]), "ks": sorted(set(occ[lab == 1].tolist())),
            "lengths": sorted({s[0] for s in strata}), "bins": list(dict.fromkeys(
                b for _, b in sorted(strata, key=lambda s: ("low", "mid", "high").index(s[1])
                                     if s[1] in ("low", "mid", "high") else 3)))}


def _evaluate(s: dict, scores: np.ndarray, sel: np.ndarray, n_bootstrap: int, seed: int, minimum=None) -> dict:
    kw = {} if minimum is None else {"min_per_class": minimum}
    return metrics.evaluate(s["lab"][sel], scores[sel], n_bootstrap=n_bootstrap, seed=seed, **kw)


def _verdicts(s: dict, rows: list[dict], methods: list[str], n_bootstrap: int, seed: int) -> list[dict]:
    """The paired k = max vs k = 1 comparison of each verdict method (trained scores; ``n_bootstrap`` resamples),
    or its n/a reason."""
    out = []
    for base in VERDICT_METHODS:
        m = headline(methods, base)
        if m is None or len(s["ks"]) < 2:
            continue
        hi, lo = s["ks"][-1], s["ks"][0]
        try:
            comp = metrics.subset_bootstrap(score_vector(rows, "trained", m), s["lab"],
                                            (s["lab"] == 1) & (s["occ"] == hi), (s["lab"] == 1) & (s["occ"] == lo),
                                            n_bootstrap=n_bootstrap, seed=seed)
        except ValueError as e:
            comp = str(e).replace("n/a: ", "")
        out.append({"method": m, "a": hi, "b": lo, "comparison": comp})
    return out


def _claim(v: dict, tag: str) -> dict:
    comp = v["comparison"]
    return make_claim(f"Traps{tag}: {method_name(v['method'])} AUROC, {v['a']} insertions > {v['b']}",
                      "more insertions easier", comp, f"k={v['a']}", f"k={v['b']}")


def compute(run: dict, methods: list[str]) -> dict:
    """Every number of the study from one run's results (``examples``, ``config``): blind, per-k and per-cell
    metrics of the trained model (and the base model's pooled AUROC, a control), the paired verdicts."""
    rows = run["examples"]
    score = run["config"]["score"]
    n_bootstrap, seed = int(score.get("n_bootstrap", 1000)) or 1000, int(score.get("seed", 0))
    s = _setup(rows)
    members, non = s["lab"] == 1, s["lab"] == 0
    blind = np.array([np.nan if r.get("blind") is None else r["blind"] for r in rows], np.float64)
    out = {"setup": s, "blind": _evaluate(s, blind, np.ones(len(rows), bool), n_bootstrap, seed),
           "per_k": {}, "cells": [], "base_all": {}, "trained_all": {}}
    for m in methods:
        sc, base = score_vector(rows, "trained", m), score_vector(rows, "base", m) if m not in ORACLE else None
        out["trained_all"][m] = _evaluate(s, sc, np.ones(len(rows), bool), n_bootstrap, seed)
        if base is not None:
            out["base_all"][m] = _evaluate(s, base, np.ones(len(rows), bool), n_bootstrap, seed)
        out["per_k"][m] = {k: _evaluate(s, sc, non | (members & (s["occ"] == k)), n_bootstrap, seed)
                           for k in s["ks"]}
    for length in s["lengths"]:
        for b in s["bins"]:
            stratum = (s["length"] == length) & (s["bin"] == b)
            for k in s["ks"]:
                sel = stratum & (non | (s["occ"] == k))
                n_mem = int((sel & members).sum())
                cell = {m: _evaluate(s, score_vector(rows, "trained", m), sel, n_bootstrap, seed,
                                     minimum=max(2, min(metrics.MIN_PER_CLASS, n_mem)))
                        for m in methods}
                out["cells"].append((length, b, k, n_mem, int((sel & non).sum()), cell))
    out["verdicts"] = _verdicts(s, rows, methods, comparisons.verdict_resamples(n_bootstrap), seed)
    out["family"] = comparisons.holm_adjust([v["comparison"] for v in out["verdicts"]
                                             if isinstance(v["comparison"], dict)])
    return out


def _ordered(methods: list[str]) -> list[str]:
    return [m for m in methods if m not in ORACLE] + [m for m in methods if m in ORACLE]


def _describe(v: dict) -> str:
    comp = v["comparison"]
    if isinstance(comp, str):
        return f"- {method_name(v['method'])}, k={v['a']} vs k={v['b']}: {na(comp)}\n"
    a, b = f"k={v['a']}", f"k={v['b']}"
    return f"- {method_name(v['method'])}: {metrics.describe(comp, a, b)}\n"


def _markdown(res: dict, methods: list[str]) -> str:
    s = res["setup"]
    ks = s["ks"]
    n_mem = {k: int(((s["lab"] == 1) & (s["occ"] == k)).sum()) for k in ks}
    b = res["blind"]
    blind_ok = b.get("auroc") is not None and 0.4 <= b["auroc"] <= 0.6
    head = (f"# Copyright traps: AUROC [95% CI] against the number of insertions\n\n{rebuild_line()}"
            f"{int((s['lab'] == 1).sum())} traps inserted ({', '.join(f'{n_mem[k]} x {k}' for k in ks)}), "
            f"{int((s['lab'] == 0).sum())} never inserted (the non-members), the same number per (length, "
            f"perplexity bin) stratum on both sides; lengths {', '.join(map(str, s['lengths']))} tokens, "
            f"perplexity bins {', '.join(s['bins'])} (the reference model's, per length).\n\n"
            f"**Blind baseline** (bag-of-words, out-of-fold; members vs non-members): AUROC {ci_cell(b, 'auroc')} "
            f"({'within' if blind_ok else 'OUTSIDE'} [0.4, 0.6]: "
            f"{'the split is not separable without the model' if blind_ok else 'the split leaks'}).\n\n")
    order = _ordered(methods)
    header = ["Method", *(f"k={k} ({n_mem[k]})" for k in ks), "All members", "Base model, all"]
    table = [[method_name(m) + (" (oracle)" if m in ORACLE else ""),
              *(ci_cell(res["per_k"][m][k], "auroc") for k in ks), ci_cell(res["trained_all"][m], "auroc"),
              ci_cell(res["base_all"].get(m), "auroc") if m not in ORACLE else "n/a (needs the trained model)"]
             for m in order]
    text = head + ("## Per number of insertions (lengths and bins pooled; each k against every non-member)\n\n"
                   "The oracle row (Ref: trained / base-model loss) needs the model before training; 'Base model' "
                   "is the same detector on the model before training (a control: ~0.5 expected).\n\n"
                   + markdown(header, table))
    if res["verdicts"]:
        text += ("\nLargest vs smallest number of insertions (paired: the same non-members, trained model):\n\n"
                 + "".join(_describe(v) for v in res["verdicts"]) + "\n"
                 + comparisons.family_note(res["family"], "k = max vs k = 1 per method"))
    cell_header = ["Length", "Bin", "k", "Members", "Non-members", *(method_name(m) for m in order)]
    cells = [[str(length), b_, str(k), str(nm), str(nn), *(ci_cell(c[m], "auroc") for m in order)]
             for length, b_, k, nm, nn, c in res["cells"]]
    text += ("\n\n## Per (insertions, perplexity bin, length) cell\n\nThe members of the cell against the "
             "non-members of its (length, bin) stratum. A cell holds fewer members than the "
             f"{metrics.MIN_PER_CLASS} the project asks for a verdict: its AUROC and interval are shown, wide, and "
             "no verdict is drawn from a cell.\n\n" + markdown(cell_header, cells))
    return text


def _csv(res: dict, methods: list[str]) -> bytes:
    rows = []
    for m in _ordered(methods):
        for k, r in res["per_k"][m].items():
            rows.append(["all", "all", k, m, r.get("auroc"), *(r.get("auroc_ci") or (None, None))])
        for length, b, k, _, _, c in res["cells"]:
            rows.append([length, b, k, m, c[m].get("auroc"), *(c[m].get("auroc_ci") or (None, None))])
    b = res["blind"]
    rows.append(["all", "all", "all", "blind", b.get("auroc"), *(b.get("auroc_ci") or (None, None))])
    return csv_bytes(["length", "bin", "insertions", "method", "auroc", "auroc_ci_lo", "auroc_ci_hi"], rows)


def _figure(res: dict, methods: list[str]) -> bytes:
    fig, ax = pyplot().subplots(figsize=(6, 4.2))
    ks = res["setup"]["ks"]
    for i, m in enumerate(_ordered(methods)):
        pts = [res["per_k"][m][k] for k in ks]
        y = np.array([num(p.get("auroc")) for p in pts], np.float64)
        ci = np.array([p.get("auroc_ci") or (np.nan, np.nan) for p in pts], np.float64)
        x = np.array(ks, np.float64) * (1 + 0.03 * (i - len(methods) / 2))  # a small offset: the bars stay apart
        ax.errorbar(x, y, yerr=np.abs(ci.T - y), fmt="o-" if m not in ORACLE else "s--", capsize=2, lw=1.2,
                    label=method_name(m) + (" (oracle)" if m in ORACLE else ""))
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("insertions of the trap in the corpus")
    ax.set_ylabel("AUROC (95% CI)")
    ax.set_title("Copyright traps: detection vs repetitions", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return figure_bytes(fig)


def traps_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """The trap study's tables and figure from its one run (``runs[0]``, with ``examples`` and ``config``):
    (markdown, {traps.md, traps.csv, traps.png: content})."""
    res = compute(runs[0], methods)
    text = _markdown(res, methods)
    return text, {"traps.md": text, "traps.csv": _csv(res, methods), "traps.png": _figure(res, methods)}


def traps_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """The trap study's claims: more insertions are easier to detect, Loss and Min-K%, k = max vs k = 1; no part of
    its own (the report prints the sweep's table, ``traps.md``, once, as every sweep's)."""
    run = runs[0][1]
    rows = run["examples"]
    n_bootstrap, seed = claim_resamples(run)
    found = _verdicts(_setup(rows), rows, run["methods"], n_bootstrap, seed)
    return [], [_claim(v, tag) for v in found]

"""The tables and figures of one contamination run, from its per-example scores (train/records.py):

* Table 3: AUROC [95% CI] per dataset and the average, reference-free methods after continued pretraining with
  the base model's AUROC beside each; the oracle reference (``ref`` = trained minus base log-likelihood, which
  needs the pre-contamination checkpoint) in its own block, never bolded; the model-free blind baseline per
  dataset; the gain over the base model as a paired bootstrap of trained vs base on the same examples.
  Bold = the best method of a column and every method the paired bootstrap cannot distinguish from it.
* Table 7: the same for TPR@5%FPR.
* roc.png, metrics.json; Figure 5c too when the corpus inserted members several times (train/sweep_tables.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mia_jax.evaluation import blind, comparisons, metrics, rounding
from mia_jax.runs import files
from mia_jax.evaluation.report import csv_bytes, figure_bytes, fmt, markdown, pyplot
from train.cells import (AVG, DATASET_NAMES, HEADLINE, NEIGHBOR_NOTE, NO_NEIGHBOR_NOTE, ORACLE, any_nan, ci_cell,
                         method_name, na, nan_cell, reason, rebuild_line)
from train.records import by_dataset, records_and_eval, score_vector
from train.sweep_tables import occurrence_figure

def run_results(rows: list[dict], methods: list[str], base_methods: list[str], *, n_bootstrap: int = 1000,
                seed: int = 0) -> dict:
    """Everything the tables of one run show, from its example rows:

    ``trained`` / ``base``: {dataset: {method: metrics.evaluate}}; ``blind``: {dataset: metrics.evaluate or None};
    ``average``: {model: {method: metrics.evaluate_mean over datasets}}; ``gain``: {dataset or "avg": {method:
    paired_bootstrap(trained, base)}}; ``best``: {model: {"auroc" | "tpr_at_5pct_fpr": {dataset or "avg":
    {"best": method, "vs": {method: paired_bootstrap(best, method)}}}}} over the reference-free methods."""
    groups = by_dataset(rows)
    labels = np.array([r["label"] for r in rows])
    dsets = [r["dataset"] for r in rows]
    kw = dict(n_bootstrap=n_bootstrap, seed=seed)
    res: dict = {"trained": {}, "base": {}, "blind": {}, "average": {"trained": {}, "base": {}}, "gain": {},
                 "best": {}}
    vec = {model: {m: score_vector(rows, model, m) for m in ms}
           for model, ms in (("trained", methods), ("base", base_methods))}
    for d, idx in groups.items():
        for model, ms in (("trained", methods), ("base", base_methods)):
            res[model][d] = {m: metrics.evaluate(labels[idx], vec[model][m][idx], **kw) for m in ms}
        b = score_vector([rows[i] for i in idx], "blind", "")
        res["blind"][d] = metrics.evaluate(labels[idx], b, **kw) if np.isfinite(b).all() else None

    def safe(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError:  # a class left empty once NaN rows are dropped, or no bootstrap asked for
            return None

    for model, ms in (("trained", methods), ("base", base_methods)):
        res["average"][model] = {m: safe(metrics.evaluate_mean, labels, vec[model][m], dsets, **kw) for m in ms}
    if n_bootstrap < 1:
        return res
    kw = dict(n_bootstrap=comparisons.verdict_resamples(n_bootstrap), seed=seed)  # every verdict: >= 2000 resamples
    columns = {**{d: (idx, None) for d, idx in groups.items()}, AVG: (list(range(len(rows))), dsets)}
    for col, (idx, g) in columns.items():
        res["gain"][col] = {m: safe(metrics.paired_bootstrap, labels[idx], vec["trained"][m][idx],
                                    vec["base"][m][idx], groups=g, **kw) for m in base_methods}
    for model, ms in (("trained", methods), ("base", base_methods)):
        free = [m for m in ms if m not in ORACLE]
        res["best"][model] = {}
        for key in ("auroc", "tpr_at_5pct_fpr"):
            res["best"][model][key] = {}
            for col, (idx, g) in columns.items():
                point = {m: (res["average"][model][m] or {}).get(key) if col == AVG else res[model][col][m][key]
                         for m in free}
                entry = metrics.compare_to_best(labels[idx], {m: vec[model][m][idx] for m in free}, point, key=key,
                                                groups=g, **kw)
                if entry is not None:
                    res["best"][model][key][col] = entry
    for key in ("auroc", "tpr_at_5pct_fpr"):
        res.setdefault("family", {})[key] = comparisons.holm_adjust(table_family(res, key), key)
    return res


def table_family(res: dict, key: str) -> list[dict]:
    """Every paired comparison behind a verdict of the ``key`` table (Table 3: AUROC, Table 7: TPR@5%FPR) of one
    run: the best of each column against each other method (both models) and each method's gain over the base
    model; Holm-corrected together (:func:`comparisons.holm_adjust`)."""
    out = [c for by_col in res.get("best", {}).values() for entry in by_col.get(key, {}).values()
           for c in entry["vs"].values()]
    return out + [c for by_m in res.get("gain", {}).values() for c in by_m.values()]


def _bold_set(res: dict, model: str, key: str, col: str) -> set[str]:
    """The best method of a column and every method not distinguishable from it (paired bootstrap)."""
    return metrics.tied_with_best(res.get("best", {}).get(model, {}).get(key, {}).get(col), key)


def _column(res: dict, model: str, col: str, m: str) -> dict | None:
    return res["average"][model].get(m) if col == AVG else res[model][col].get(m)


def metric_table(results: dict, methods: list[str], key: str, model: str = "trained") -> tuple[list[str], list]:
    """Rows [method name, cell per dataset..., average] of metric ``key`` with intervals; with the base model's
    value and interval beside each trained cell when ``model == "trained"`` and the method has one. A cell that
    could not be computed is n/a with its reason, never bold; when a method has NaN/inf scores, a last column
    ``n (NaN)`` counts the examples scored and the scores excluded (over the datasets, this model)."""
    datasets = list(results[model])
    cols = [*datasets, AVG]
    header = ["Method"]
    for c in cols:
        name = "Avg." if c == AVG else DATASET_NAMES.get(c, c)
        header += [name] + ([f"{name} base"] if model == "trained" else [])
    with_nan = any_nan(results[model][d].get(m) for d in datasets for m in methods)
    if with_nan:
        header.append("n (NaN)")
    rows = []
    for m in methods:
        row = [method_name(m)]
        bold = [m in _bold_set(results, model, key, c) and m not in ORACLE for c in cols]
        for c, b in zip(cols, bold):
            cell = ci_cell(_column(results, model, c, m), key)
            row.append(f"**{cell}**" if b and not cell.startswith("n/a") else cell)
            if model == "trained":
                base = _column(results, "base", c, m) if m in results["base"][datasets[0]] else None
                row.append(ci_cell(base, key))
        if with_nan:
            row.append(nan_cell([results[model][d].get(m) for d in datasets]))
        rows.append(row)
    return header, rows


def _statements(results: dict, key: str, label: str) -> list[str]:
    out = []
    datasets = list(results["trained"])
    for model in ("trained", "base"):
        for col in (AVG, *datasets):
            entry = results.get("best", {}).get(model, {}).get(key, {}).get(col)
            where = "average over datasets" if col == AVG else DATASET_NAMES.get(col, col)
            if entry is None:
                why = next((reason(_column(results, model, col, m)) for m in results[model][datasets[0]]
                            if reason(_column(results, model, col, m))), None)
                if why:  # no method has a value in this column
                    out.append(f"{model} model, {where}: {na(why)}")
                continue
            best = method_name(entry["best"])
            found = comparisons.runner_up(entry, key)
            if found is None:
                out.append(f"{model}, {where}: best reference-free {label}: {best} (no other method to compare "
                           "that does not rank the texts identically)")
                continue
            runner, c = found
            verdict = {"A > B": "best reference-free method",
                       "undecided": "highest point estimate, undecided against the runner-up"}.get(
                c[key]["verdict"], "highest point estimate, not distinguishable from the runner-up")
            out.append(f"{model} model, {where}: {best}, {verdict}; "
                       + metrics.describe(c, best, method_name(runner), key=key, label=label))
    return out


def run_tables(results: dict, methods: list[str]) -> dict[str, str | bytes]:
    """table3.{md,csv} (AUROC) and table7.{md,csv} (TPR@5%FPR) of one run (``results`` from :func:`run_results`):
    {file name: content}."""
    outputs: dict[str, str | bytes] = {}
    datasets = list(results["trained"])
    free = [m for m in methods if m not in ORACLE]
    oracle = [m for m in methods if m in ORACLE]
    for name, key, title in (("table3", "auroc", "AUROC"), ("table7", "tpr_at_5pct_fpr", "TPR@5%FPR")):
        parts = [f"# {'Table 3' if name == 'table3' else 'Table 7'}: {title} [95% CI]\n\n{rebuild_line()}"]
        header, rows = metric_table(results, free, key)
        parts.append(f"{title}, reference-free methods, after continued pretraining (`X base`: the same method on "
                     "the base model, before training). Bold: the best method of the column and every method the "
                     "paired bootstrap does not distinguish from it.\n\n" + markdown(header, rows))
        if oracle:
            header, rows = metric_table(results, oracle, key)
            rows = [[c.replace("**", "") for c in r] for r in rows]
            parts.append(f"{title}, oracle reference (needs the exact pre-contamination checkpoint, which a real "
                         "auditor does not have; not comparable with the rows above, never bolded):\n\n"
                         + markdown(header, rows))
        blind_row = ["Blind BoW (no model)"] + [
            ci_cell(results["blind"].get(d), key) if results["blind"].get(d) is not None
            else "n/a (too few examples for the blind baseline's cross-validation)" for d in datasets]
        parts.append(f"{title} of the model-free blind baseline ({blind.NAME}, bag-of-words, {blind.FOLDS}-fold "
                     "CV within each dataset's split): a split it separates is separable without a model.\n\n"
                     + markdown(["Baseline", *(DATASET_NAMES.get(d, d) for d in datasets)], [blind_row]))
        warns = [f"WARNING: {DATASET_NAMES.get(d, d)}: blind baseline AUROC {fmt(r['auroc'])} > {blind.WARN_AUROC}: "
                 "members and non-members differ in distribution; detector AUROCs on it overstate the signal."
                 for d, r in results["blind"].items()
                 if r is not None and r.get("auroc") is not None and r["auroc"] > blind.WARN_AUROC]
        parts += [w + "\n" for w in warns]
        gain_rows = []
        for m in [m for m in methods if m in results["base"][datasets[0]]]:
            cells = []
            for c in [*datasets, AVG]:
                g = results.get("gain", {}).get(c, {}).get(m)
                cells.append(na(reason(_column(results, "trained", c, m)) or reason(_column(results, "base", c, m)))
                             if g is None else rounding.diff_ci(g[key]["diff"], g[key]["ci"])
                             + {"not distinguishable": " ~", "undecided": " ?"}.get(g[key]["verdict"], ""))
            gain_rows.append([method_name(m), *cells])
        parts.append(f"{title} gain over the base model (trained - base, paired bootstrap on the same examples; "
                     "~ = not distinguishable from 0, ? = undecided):\n\n"
                     + markdown(["Method", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."], gain_rows))
        parts.append("Comparisons (paired bootstrap; a method is called best only where its difference with the "
                     "runner-up, the best method that does not rank the texts identically, is stated after the "
                     "correction below):\n\n"
                     + "".join(f"- {s}\n" for s in _statements(results, key, title)))
        family = results.get("family", {}).get(key, 0)
        parts.append(comparisons.family_note(family, "bold cells, gains and statements") + "\n")
        parts.append((NEIGHBOR_NOTE if "neighbor" in methods else NO_NEIGHBOR_NOTE) + "\n")
        outputs[f"{name}.md"] = "\n".join(parts)
        ci_key = f"{key}_ci"
        csv_rows = [[model, d, m, r[key], *(r.get(ci_key) or (None, None)), r["n_members"], r["n_nonmembers"]]
                    for model in ("trained", "base") for d, by_method in results[model].items()
                    for m, r in by_method.items()]
        csv_rows += [[model, AVG, m, r[key], *(r.get(ci_key) or (None, None)), None, None]
                     for model in ("trained", "base") for m, r in results["average"][model].items() if r]
        csv_rows += [["none", d, blind.NAME, r[key], *(r.get(ci_key) or (None, None)), r["n_members"],
                      r["n_nonmembers"]] for d, r in results["blind"].items() if r]
        outputs[f"{name}.csv"] = csv_bytes(
            ["model", "dataset", "method", key, f"{key}_ci_lo", f"{key}_ci_hi", "n_members", "n_nonmembers"], csv_rows)
    return outputs


def roc_figure(rows: list[dict], methods: list[str]) -> bytes:
    """roc.png: one panel per dataset, ROC curves of the headline methods for the trained model (a method with
    fewer than metrics.MIN_PER_CLASS scored examples of a class in a dataset is left out of its panel)."""
    shown = [m for m in methods if m.partition("@")[0] in (*HEADLINE, "zlib", "lowercase", "ref", "neighbor")]
    groups = by_dataset(rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.6), squeeze=False)
    for ax, (d, idx) in zip(axes[0], groups.items()):
        sub = [rows[i] for i in idx]
        labels = np.array([r["label"] for r in sub])
        for m in shown:
            sc = score_vector(sub, "trained", m)
            keep = np.isfinite(sc)
            if metrics.too_few(int((labels[keep] == 1).sum()), int((labels[keep] == 0).sum())):
                continue
            fpr, tpr, _ = metrics.roc_curve(labels[keep], sc[keep])
            ax.plot(fpr, tpr, lw=1.2, label=f"{method_name(m)} {metrics.auroc(labels[keep], sc[keep]):.2f}")
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="grey")
        ax.set_title(DATASET_NAMES.get(d, d), fontsize=10)
        ax.set_xlabel("FPR", fontsize=8)
        ax.set_ylabel("TPR", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="lower right")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.9, wspace=0.3)
    return figure_bytes(fig, dpi=100, tight=False)


def run_outputs(rows: list[dict], info: dict) -> tuple[dict, dict[str, str | bytes]]:
    """(results, {file name: content}) of one run from its example rows and its ``run.json`` (``info``: ``methods``,
    ``config.score``, ``config.corpus.occurrence``): metrics.json, table3/table7 and roc.png; fig5c.* too when the
    corpus used Poisson or bucketed occurrences. Nothing is written."""
    methods = info["methods"]
    score = info["config"]["score"]
    results = run_results(rows, methods, [m for m in methods if m not in ORACLE],
                          n_bootstrap=score["n_bootstrap"], seed=score["seed"])
    outputs: dict[str, str | bytes] = {"metrics.json": json.dumps(results, indent=2) + "\n"}
    outputs.update(run_tables(results, methods))
    outputs["roc.png"] = roc_figure(rows, methods)
    if info["config"]["corpus"].get("occurrence") in ("poisson", "buckets"):
        outputs.update(occurrence_figure(*records_and_eval(rows), methods))
    return results, outputs


def write_run(out: Path, rows: list[dict], info: dict) -> dict:
    """:func:`run_outputs` written into ``out`` (all or none); returns the results."""
    results, outputs = run_outputs(rows, info)
    files.write_all(out, outputs)
    return results

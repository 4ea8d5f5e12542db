"""The tables and figures of a contamination sweep, from its runs' per-example scores (train/records.py):

* Table 4: AUROC [95% CI] per dataset for each learning rate (Min-K% first, then PPL and Min-K%++), with the
  paired comparison of the learning rates on the same examples.
* Figure 5a / 5b: Min-K% AUROC against the contamination rate (% of corpus tokens) over background sizes.
* Figure 5c: AUROC of the members inserted k times against all non-members, per k, with the comparison of the
  largest k against k = 1 (the same non-members, :func:`mia_jax.evaluation.metrics.subset_bootstrap`).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from mia_jax.evaluation import comparisons, metrics
from mia_jax.evaluation.report import csv_bytes, figure_bytes, fmt, markdown, pyplot
from train.cells import (AVG, DATASET_NAMES, HEADLINE, any_nan, ci_cell, headline,
                         method_name, na, nan_cell, num, rebuild_line)
from train.records import by_dataset, records_and_eval, same_examples, score_vector

def _examples_of(res: dict) -> list[dict] | None:
    return res.get("examples") if isinstance(res, dict) else None


def _bootstrap_cfg(res: dict) -> tuple[int, int]:
    """(n_bootstrap, seed) of a run's config.score (results returned by run_experiment / rebuild_run carry it)."""
    score = res.get("config", {}).get("score", {})
    return int(score.get("n_bootstrap", 1000)) or 1000, int(score.get("seed", 0))


def _paired_models(rows_a: list[dict], rows_b: list[dict], m: str, n_bootstrap: int, seed: int) -> dict:
    """{dataset or "avg": paired_bootstrap of method ``m``'s trained scores of run A vs run B (same examples,
    ``comparisons.verdict_resamples(n_bootstrap)`` resamples), or the reason it is n/a (a class with fewer than
    metrics.MIN_PER_CLASS examples)}."""
    n_bootstrap = comparisons.verdict_resamples(n_bootstrap)
    labels = np.array([r["label"] for r in rows_a])
    a, b = score_vector(rows_a, "trained", m), score_vector(rows_b, "trained", m)
    cols = {d: (idx, None) for d, idx in by_dataset(rows_a).items()}
    cols[AVG] = (list(range(len(rows_a))), [r["dataset"] for r in rows_a])
    out: dict = {}
    for d, (idx, groups) in cols.items():
        try:
            out[d] = metrics.paired_bootstrap(labels[idx], a[idx], b[idx], groups=groups, n_bootstrap=n_bootstrap,
                                              seed=seed)
        except ValueError as e:
            out[d] = str(e).replace("n/a: ", "")
    return out


def _comparison_lines(comp: dict, name_a: str, name_b: str) -> str:
    return "".join(f"- {'average' if d == AVG else DATASET_NAMES.get(d, d)}: "
                   + (na(c) if isinstance(c, str) else metrics.describe(c, name_a, name_b)) + "\n"
                   for d, c in comp.items())


def _holm(comps) -> int:
    """Holm's correction (AUROC) over the comparisons of one table (``comps``: {column: comparison or the reason it
    is n/a} dicts); returns the family's size."""
    return comparisons.holm_adjust([c for comp in comps for c in comp.values() if not isinstance(c, str)])


def _lr_comparisons(runs: dict[float, dict], methods: list[str]) -> dict:
    """{method: _paired_models of the largest vs the smallest learning rate} for Table 4's methods, Holm-corrected
    together; {} without two runs on the same examples."""
    lrs = sorted(runs)
    ea, eb = _examples_of(runs[lrs[-1]]), _examples_of(runs[lrs[0]])
    if len(lrs) < 2 or not same_examples(ea, eb):
        return {}
    n_bootstrap, seed = _bootstrap_cfg(next(iter(runs.values())))
    comps = {m: _paired_models(ea, eb, m, n_bootstrap, seed)
             for m in (headline(methods, base) for base in HEADLINE) if m is not None}
    _holm(comps.values())
    return comps


def table4(runs: dict[float, dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Table 4 from {lr: results of that run} (with ``examples``: the paired comparison of the learning rates,
    largest vs smallest, with the runs' score.n_bootstrap and seed): (markdown, {file name: content})."""
    datasets = list(next(iter(runs.values()))["trained"])
    parts, rows_csv = [f"# Table 4: AUROC [95% CI] per learning rate\n\n{rebuild_line()}"], []
    lrs = sorted(runs)
    comps = _lr_comparisons(runs, methods)
    for base in HEADLINE:
        m = headline(methods, base)
        if m is None:
            continue
        rows = []
        per_lr = {lr: [runs[lr]["trained"][d][m] for d in datasets] for lr in lrs}
        with_nan = any_nan(c for cells in per_lr.values() for c in cells)
        for lr in lrs:
            res = runs[lr]
            cells = per_lr[lr] + [res.get("average", {}).get("trained", {}).get(m)]
            rows.append([f"{lr:g}", *(ci_cell(c, "auroc") for c in cells)]
                        + ([nan_cell(per_lr[lr])] if with_nan else []))
            rows_csv += [[lr, m, d, c["auroc"], *(c.get("auroc_ci") or (None, None))]
                         for d, c in zip([*datasets, AVG], cells) if c]
        header = ["Learning rate", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."] + \
            (["n (NaN)"] if with_nan else [])
        parts.append(f"AUROC, {method_name(m)}:\n\n" + markdown(header, rows))
        hi, lo = lrs[-1], lrs[0]
        if m in comps:
            parts.append(f"lr {hi:g} vs {lo:g}, {method_name(m)} (paired bootstrap, same examples):\n\n"
                         + _comparison_lines(comps[m], f"lr {hi:g}", f"lr {lo:g}"))
        elif len(lrs) > 1:
            parts.append(f"lr {hi:g} vs {lo:g}: no comparison stated (per-example scores of both runs on the same "
                         "examples are needed).\n")
    if comps:
        parts.append(comparisons.family_note(_holm(comps.values()), "learning rates, per method and column") + "\n")
    text = "\n".join(parts)
    return text, {"table4.md": text, "table4.csv": csv_bytes(
        ["lr", "method", "dataset", "auroc", "auroc_ci_lo", "auroc_ci_hi"], rows_csv)}


def size_figure(name: str, runs: list[tuple[dict, dict]], methods: list[str], title: str) -> dict[str, str | bytes]:
    """Figure 5a/5b: ``runs`` = [(manifest or run.json "corpus", results)] over corpus sizes -> {<name>.png/.csv/.md:
    content}."""
    m = headline(methods) or methods[0]
    points = sorted(((man["contamination_rate"] * 100, i, man, res) for i, (man, res) in enumerate(runs)),
                    key=lambda p: (p[0], p[1]))
    datasets = list(points[0][3]["trained"])
    rows = [[rate, man["tokens"]["total"], man["tokens"]["background"], d, res["trained"][d][m]["auroc"],
             *(res["trained"][d][m].get("auroc_ci") or (None, None)), res["base"][d][m]["auroc"]]
            for rate, _, man, res in points for d in datasets]
    outputs: dict[str, str | bytes] = {f"{name}.csv": csv_bytes(
        ["contamination_pct", "total_tokens", "background_tokens", "dataset", "auroc_trained", "auroc_trained_ci_lo",
         "auroc_trained_ci_hi", "auroc_base"], rows)}
    with_nan = any_nan(res["trained"][d][m] for _, _, _, res in points for d in datasets)
    header = ["Corpus tokens", "Contamination %", *(DATASET_NAMES.get(d, d) for d in datasets)] + \
        (["n (NaN)"] if with_nan else [])
    md = [[str(man["tokens"]["total"]), fmt(rate, 2), *(ci_cell(res["trained"][d][m], "auroc") for d in datasets)]
          + ([nan_cell([res["trained"][d][m] for d in datasets])] if with_nan else [])
          for rate, _, man, res in points]
    text = f"# {title}\n\n{rebuild_line()}{method_name(m)} AUROC [95% CI]:\n\n" + markdown(header, md)
    (hi_rate, _, _, hi), (lo_rate, _, _, lo) = points[-1], points[0]
    if len(points) > 1 and same_examples(_examples_of(hi), _examples_of(lo)):
        comp = _paired_models(_examples_of(hi), _examples_of(lo), m, *_bootstrap_cfg(hi))
        family = _holm([comp])
        text += (f"\nHighest ({fmt(hi_rate, 2)}%) vs lowest ({fmt(lo_rate, 2)}%) contamination rate, {method_name(m)}, "
                 "paired bootstrap on the same examples:\n\n"
                 + _comparison_lines(comp, f"{fmt(hi_rate, 2)}%", f"{fmt(lo_rate, 2)}%")
                 + "\n" + comparisons.family_note(family, "per column") + "\n")
    outputs[f"{name}.md"] = text
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for d in datasets:
        ax.plot([p[0] for p in points], [num(p[3]["trained"][d][m]["auroc"]) for p in points], "o-",
                label=DATASET_NAMES.get(d, d))
    ax.set_xscale("log")
    ax.set_xlabel("contamination rate (% of corpus tokens)")
    ax.set_ylabel(f"AUROC ({method_name(m)})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    outputs[f"{name}.png"] = figure_bytes(fig)
    return outputs


def group_scores(records: list[dict], eval_set: list[dict], methods: list[str], group: str) -> tuple[list[int], dict]:
    """(indices, {method: scores}) of one dataset, or of ``"all"``: every dataset pooled **after** rank-normalising
    each dataset's scores (ranks / n within the dataset, ties averaged), so that no dataset's score scale (e.g.
    IMDB's long reviews vs TruthfulQA's short answers) decides the pooled AUROC."""
    idx = [i for i, e in enumerate(eval_set) if group == "all" or e["dataset"] == group]
    scores = metrics.scores_by_method([records[i] for i in idx], methods)
    if group == "all":
        datasets = np.array([eval_set[i]["dataset"] for i in idx])
        for m, v in scores.items():
            v = v.astype(np.float64).copy()
            for d in dict.fromkeys(datasets.tolist()):
                sel = (datasets == d) & np.isfinite(v)
                v[sel] = rankdata(v[sel]) / max(int(sel.sum()), 1)
            scores[m] = v
    return idx, scores


def occurrence_curve(records: list[dict], eval_set: list[dict], methods: list[str], min_members: int = 3, *,
                     n_bootstrap: int = 0, seed: int = 0) -> list:
    """[(dataset or 'all', k, n_members, {method: metrics.evaluate of members with k occurrences vs all
    non-members})] (``n_bootstrap`` resamples for the intervals); 'all' pools the datasets after per-dataset rank
    normalisation (``group_scores``)."""
    groups = ["all", *dict.fromkeys(r["dataset"] for r in eval_set)]
    rows = []
    for g in groups:
        idx, scores = group_scores(records, eval_set, methods, g)
        occ = np.array([eval_set[i]["occurrences"] for i in idx])
        lab = np.array([eval_set[i]["label"] for i in idx])
        for k in sorted(set(occ[lab == 1].tolist())):
            sel = (lab == 0) | (occ == k)
            if (occ == k).sum() < min_members:
                continue
            res = {m: metrics.evaluate(lab[sel], scores[m][sel], n_bootstrap=n_bootstrap, seed=seed) for m in methods}
            rows.append((g, int(k), int((occ == k).sum()), res))
    return rows


def occurrence_figure(records: list[dict], eval_set: list[dict], methods: list[str], *, n_bootstrap: int = 1000,
                      seed: int = 0) -> dict[str, str | bytes]:
    """Figure 5c -> {fig5c.png / .csv / .md: content}, with the largest k against k = 1 per dataset (paired in the
    non-members: metrics.subset_bootstrap; n/a with the reason when a side has fewer than metrics.MIN_PER_CLASS
    examples). ``records``: {"scores": {method: score}} per eval example."""
    shown = [m for m in (headline(methods, b) for b in HEADLINE) if m]
    rows = occurrence_curve(records, eval_set, shown, n_bootstrap=n_bootstrap, seed=seed)
    outputs: dict[str, str | bytes] = {"fig5c.csv": csv_bytes(
        ["dataset", "occurrences", "n_members", *(f"{m}{s}" for m in shown for s in ("", "_ci_lo", "_ci_hi"))],
        [[g, k, n, *(v for m in shown for v in (r[m]["auroc"], *(r[m]["auroc_ci"] or (None, None))))]
         for g, k, n, r in rows])}
    with_nan = any_nan(r[m] for _, _, _, r in rows for m in shown)
    header = ["Dataset", "Occurrences", "Members", *(method_name(m) for m in shown)] + \
        ([f"n (NaN) {method_name(m)}" for m in shown] if with_nan else [])
    md = [[DATASET_NAMES.get(g, g), str(k), str(n), *(ci_cell(r[m], "auroc") for m in shown)]
          + ([nan_cell([r[m]]) for m in shown] if with_nan else []) for g, k, n, r in rows]
    text = (f"# Figure 5c: AUROC [95% CI] of the members inserted k times against all non-members\n\n"
            "'All' pools the datasets after rank-normalising each dataset's scores.\n\n"
            f"{rebuild_line()}" + markdown(header, md))
    lines, family = [], []
    if n_bootstrap and shown:
        m = shown[0]
        for g in dict.fromkeys(r[0] for r in rows):
            ks = [k for gg, k, _, _ in rows if gg == g]
            if len(ks) < 2 or ks[0] != 1:
                continue
            idx, sc = group_scores(records, eval_set, [m], g)
            sc = sc[m]
            occ = np.array([eval_set[i]["occurrences"] for i in idx])
            lab = np.array([eval_set[i]["label"] for i in idx])
            try:
                c = metrics.subset_bootstrap(sc, lab, (lab == 1) & (occ == ks[-1]), (lab == 1) & (occ == 1),
                                             n_bootstrap=comparisons.verdict_resamples(n_bootstrap), seed=seed)
                family.append(c)
                lines.append((g, m, c, ks[-1]))
            except ValueError as e:
                lines.append((g, m, f"k={ks[-1]} vs k=1: {na(str(e).replace('n/a: ', ''))}", ks[-1]))
    if lines:
        comparisons.holm_adjust(family)
        text += ("\nLargest k vs k = 1 (bootstrap of the difference, the same non-members):\n\n"
                 + "".join(f"- {DATASET_NAMES.get(g, g)}, {method_name(m)}: "
                           + (c if isinstance(c, str) else metrics.describe(c, f"k={k}", "k=1")) + "\n"
                           for g, m, c, k in lines)
                 + "\n" + comparisons.family_note(len(family), "one per dataset and the pooled one") + "\n")
    outputs["fig5c.md"] = text
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for g in dict.fromkeys(r[0] for r in rows):
        pts = [(k, num(r[shown[0]]["auroc"])) for gg, k, n, r in rows if gg == g]
        ax.plot(*zip(*pts), "o-", lw=2.5 if g == "all" else 1.2, label=DATASET_NAMES.get(g, g))
    ax.set_xlabel("occurrences of the example in the corpus")
    ax.set_ylabel(f"AUROC ({method_name(shown[0])})")
    ax.set_title("Figure 5c: detection vs occurrence frequency", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    outputs["fig5c.png"] = figure_bytes(fig)
    return outputs


def lr_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Table 4 of a learning-rate sweep: ``runs``, the results of each run (with ``examples`` and ``config``)."""
    return table4({r["config"]["train"]["lr"]: r for r in runs}, methods)


def _size_table(name: str, title: str, runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    outs = size_figure(name, [(r["corpus"], r) for r in runs], methods, title)
    return outs[f"{name}.md"], outs


def size_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Figure 5a of a background-size sweep: ``runs``, the results of each run (with ``corpus``)."""
    return _size_table("fig5a", "Figure 5a: outlier contaminants (downstream examples) vs corpus size", runs, methods)


def news_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Figure 5b of a news sweep: ``runs``, the results of each run (with ``corpus``)."""
    return _size_table("fig5b", "Figure 5b: in-distribution contaminants (2023 news) vs corpus size", runs, methods)


def occurrence_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Figure 5c of an occurrence sweep (one run: ``runs[0]``, with ``examples``)."""
    outs = occurrence_figure(*records_and_eval(runs[0]["examples"]), methods)
    return outs["fig5c.md"], outs

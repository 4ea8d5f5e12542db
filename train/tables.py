"""The paper's contamination tables and figures as markdown / CSV / PNG.

* Table 3: AUROC per dataset (and the average) for every method, after continued pretraining, with the
  base model's AUROC beside it (same texts, same methods, before training).
* Table 7: the same for TPR@5%FPR.
* Table 4: AUROC per dataset for each learning rate (Min-K% first, then PPL and Min-K%++).
* Figure 5a / 5b: Min-K% AUROC against the contamination rate (% of corpus tokens) over background sizes,
  for the downstream (outlier) and news (in-distribution) contaminants.
* Figure 5c: AUROC of the members inserted k times against all non-members, per k.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mia_jax.report import best_in_bold, fmt, markdown, pyplot, save_figure, write_csv

DATASET_NAMES = {"boolq": "BoolQ", "commonsenseqa": "CommonsenseQA", "imdb": "IMDB", "truthfulqa": "TruthfulQA",
                 "news": "News 2023"}
BASE_NAMES = {"loss": "Loss", "ppl": "PPL", "zlib": "Zlib", "lowercase": "Lowercase", "entropy": "Entropy",
              "rank": "Rank", "ref": "Ref (base model as reference)", "min_k": "Min-K% Prob", "min_k_pp": "Min-K%++",
              "max_k": "Max-K%"}
HEADLINE = ("min_k", "ppl", "min_k_pp")  # Table 4 / Figure 5 methods, in this order


def method_name(method: str) -> str:
    base, _, k = method.partition("@")
    name = BASE_NAMES.get(base, base)
    return f"{name} (k={float(k):.0%})" if k else name


def headline(methods, base: str = "min_k") -> str | None:
    return next((m for m in methods if m.partition("@")[0] == base), None)


def _avg(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals and len(vals) == len(values) else None


def metric_table(results: dict, methods: list[str], key: str) -> tuple[list[str], list[list]]:
    """Rows [method, value per dataset..., average] of metric ``key`` for one model's results."""
    datasets = list(results)
    rows = []
    for m in methods:
        vals = [results[d][m][key] if m in results[d] else None for d in datasets]
        rows.append([method_name(m), *vals, _avg(vals)])
    return ["Method", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."], rows


def write_run_tables(out: Path, results: dict, methods: list[str]) -> None:
    """table3.{md,csv} (AUROC) and table7.{md,csv} (TPR@5%FPR) of one run."""
    for name, key, title in (("table3", "auroc", "AUROC"), ("table7", "tpr_at_5pct_fpr", "TPR@5%FPR")):
        parts = []
        for model, label in (("trained", "after continued pretraining"), ("base", "base model, before training")):
            ms = [m for m in methods if any(m in v for v in results[model].values())]
            header, rows = metric_table(results[model], ms, key)
            parts.append(f"{title}, {label}:\n\n" + markdown(header, best_in_bold(rows, shown_ties=True)))
        gain_header, trained_rows = metric_table(results["trained"], methods, key)
        _, base_rows = metric_table(results["base"], [m for m in methods if m != "ref"], key)
        base_by = {r[0]: r for r in base_rows}
        gains = [[r[0], *[(a - b) if a is not None and b is not None else None
                          for a, b in zip(r[1:], base_by[r[0]][1:])]] for r in trained_rows if r[0] in base_by]
        parts.append(f"{title} gain over the base model (trained - base):\n\n" +
                     markdown(gain_header, [[g[0], *(fmt(v) for v in g[1:])] for g in gains]))
        (out / f"{name}.md").write_text("\n".join(parts))
        ci_key = "auroc_ci" if key == "auroc" else "tpr_at_5pct_fpr_ci"
        write_csv(out / f"{name}.csv",
                  ["model", "dataset", "method", key, f"{key}_ci_lo", f"{key}_ci_hi", "n_members", "n_nonmembers"],
                  [[model, d, m, r[key], *(r.get(ci_key) or (None, None)), r["n_members"], r["n_nonmembers"]]
                   for model, by_dataset in results.items() for d, by_method in by_dataset.items()
                   for m, r in by_method.items()])


def plot_run_rocs(out: Path, records: list[dict], eval_set: list[dict], methods: list[str]) -> None:
    """roc.png: one panel per dataset, ROC curves of the headline methods for the trained model."""
    from mia_jax import metrics

    datasets = list(dict.fromkeys(r["dataset"] for r in eval_set))
    shown = [m for m in methods if m.partition("@")[0] in (*HEADLINE, "zlib", "lowercase", "ref")]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(datasets), figsize=(3.6 * len(datasets), 3.6), squeeze=False)
    for ax, d in zip(axes[0], datasets):
        idx = [i for i, r in enumerate(eval_set) if r["dataset"] == d]
        scores = metrics.scores_by_method([records[i] for i in idx], shown)
        labels = np.array([eval_set[i]["label"] for i in idx])
        for m in shown:
            keep = np.isfinite(scores[m])
            if len(set(labels[keep].tolist())) < 2:
                continue
            fpr, tpr, _ = metrics.roc_curve(labels[keep], scores[m][keep])
            ax.plot(fpr, tpr, lw=1.2, label=f"{method_name(m)} {metrics.auroc(labels[keep], scores[m][keep]):.2f}")
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="grey")
        ax.set_title(DATASET_NAMES.get(d, d), fontsize=10)
        ax.set_xlabel("FPR", fontsize=8)
        ax.set_ylabel("TPR", fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.9, wspace=0.3)
    save_figure(fig, out / "roc.png", dpi=100, tight=False)


# ----------------------------------------------------------------------------- ablations


def write_table4(out: Path, runs: dict[float, dict], methods: list[str]) -> str:
    """Table 4 from {lr: metrics of that run}; returns the markdown."""
    datasets = list(next(iter(runs.values()))["trained"])
    parts, rows_csv = [], []
    for base in HEADLINE:
        m = headline(methods, base)
        if m is None:
            continue
        rows = []
        for lr, res in sorted(runs.items()):
            vals = [res["trained"][d][m]["auroc"] for d in datasets]
            rows.append([f"{lr:g}", *vals, _avg(vals)])
            rows_csv += [[lr, m, d, v] for d, v in zip(datasets, vals)]
        header = ["Learning rate", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."]
        parts.append(f"AUROC, {method_name(m)}:\n\n" + markdown(header, best_in_bold(rows, shown_ties=True)))
    text = "\n".join(parts)
    (out / "table4.md").write_text(text)
    write_csv(out / "table4.csv", ["lr", "method", "dataset", "auroc"], rows_csv)
    return text


def write_size_figure(out: Path, name: str, runs: list[tuple[dict, dict]], methods: list[str], title: str) -> None:
    """Figure 5a/5b: ``runs`` = [(manifest, metrics)] over corpus sizes -> <name>.png / .csv / .md."""
    m = headline(methods) or methods[0]
    points = sorted((man["contamination_rate"] * 100, man, res) for man, res in runs)
    datasets = list(points[0][2]["trained"])
    rows = [[rate, man["tokens"]["total"], man["tokens"]["background"], d, res["trained"][d][m]["auroc"],
             res["base"][d][m]["auroc"]] for rate, man, res in points for d in datasets]
    write_csv(out / f"{name}.csv", ["contamination_pct", "total_tokens", "background_tokens", "dataset",
                               "auroc_trained", "auroc_base"], rows)
    header = ["Corpus tokens", "Contamination %", *(DATASET_NAMES.get(d, d) for d in datasets)]
    md = [[str(man["tokens"]["total"]), f"{rate:.2f}", *(fmt(res["trained"][d][m]["auroc"]) for d in datasets)]
          for rate, man, res in points]
    (out / f"{name}.md").write_text(f"{title} ({method_name(m)} AUROC):\n\n" + markdown(header, md))
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for d in datasets:
        ax.plot([p[0] for p in points], [p[2]["trained"][d][m]["auroc"] for p in points], "o-",
                label=DATASET_NAMES.get(d, d))
    ax.set_xscale("log")
    ax.set_xlabel("contamination rate (% of corpus tokens)")
    ax.set_ylabel(f"AUROC ({method_name(m)})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out / f"{name}.png")


def occurrence_curve(records: list[dict], eval_set: list[dict], methods: list[str], min_members: int = 3) -> list:
    """[(dataset or 'all', k, n_members, {method: AUROC of members with k occurrences vs all non-members})]."""
    from mia_jax import metrics

    groups = {"all": list(range(len(eval_set)))}
    for i, r in enumerate(eval_set):
        groups.setdefault(r["dataset"], []).append(i)
    rows = []
    for g, idx in groups.items():
        scores = metrics.scores_by_method([records[i] for i in idx], methods)
        occ = np.array([eval_set[i]["occurrences"] for i in idx])
        lab = np.array([eval_set[i]["label"] for i in idx])
        for k in sorted(set(occ[lab == 1].tolist())):
            sel = (lab == 0) | (occ == k)
            if (occ == k).sum() < min_members:
                continue
            res = {m: metrics.evaluate(lab[sel], scores[m][sel], n_bootstrap=0)["auroc"] for m in methods}
            rows.append((g, int(k), int((occ == k).sum()), res))
    return rows


def write_occurrence_figure(out: Path, records: list[dict], eval_set: list[dict], methods: list[str]) -> None:
    """Figure 5c -> fig5c.png / .csv / .md."""
    shown = [m for m in (headline(methods, b) for b in HEADLINE) if m]
    rows = occurrence_curve(records, eval_set, shown)
    write_csv(out / "fig5c.csv", ["dataset", "occurrences", "n_members", *shown],
         [[g, k, n, *(r[m] for m in shown)] for g, k, n, r in rows])
    header = ["Dataset", "Occurrences", "Members", *(method_name(m) for m in shown)]
    md = [[DATASET_NAMES.get(g, g), str(k), str(n), *(fmt(r[m]) for m in shown)] for g, k, n, r in rows]
    (out / "fig5c.md").write_text("AUROC of the members inserted k times against all non-members:\n\n"
                                  + markdown(header, md))
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for g in dict.fromkeys(r[0] for r in rows):
        pts = [(k, r[shown[0]]) for gg, k, n, r in rows if gg == g]
        ax.plot(*zip(*pts), "o-", lw=2.5 if g == "all" else 1.2, label=DATASET_NAMES.get(g, g))
    ax.set_xlabel("occurrences of the example in the corpus")
    ax.set_ylabel(f"AUROC ({method_name(shown[0])})")
    ax.set_title("Figure 5c: detection vs occurrence frequency", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out / "fig5c.png")


def load_metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())

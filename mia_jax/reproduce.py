"""Reproduce Shi et al. (2023)'s WikiMIA evaluation: Table 1 (AUROC), Table 6 (TPR@5%FPR),
Figure 2b (AUROC per text length) and the k sweep of Min-K% / Min-K%++, for any set of models.

Every (model, length, setting) cell is one ``runner.score_dataset`` run into its own folder (so a
killed reproduction resumes); this module only arranges the cells and draws the tables and plots.
Table 1 / Table 6 average a method's metric over the requested lengths (the paper pools its
lengths into one column per model and setting).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax import blind, data, metrics, report, rundir, runner

K_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Table 1's rows: (display name, method)
PAPER_METHODS = (("Neighbor", "neighbor"), ("PPL", "loss"), ("Zlib", "zlib"), ("Lowercase", "lowercase"),
                 ("Smaller Ref", "ref"), ("Min-K% Prob", "min_k@0.2"), ("Min-K%++", "min_k_pp@0.2"))
BLIND_ROW = "Blind BoW (no model)"
SETTINGS = ("Ori.", "Para.")


def methods_for(rows: Sequence[tuple[str, str]]) -> list[str]:
    """The paper rows' methods plus both k sweeps, without duplicates."""
    out = [m for _, m in rows]
    out += [f"{base}@{k:g}" for base in ("min_k", "min_k_pp") for k in K_SWEEP]
    return list(dict.fromkeys(out))


def paraphrased(length: int, para_dir: str | Path | None):
    """The user-supplied paraphrased WikiMIA split ("Para." setting), or None when not given."""
    if para_dir is None:
        return None
    path = Path(para_dir) / f"WikiMIA_length{length}_paraphrased.jsonl"
    return data.load_records(path, "input", "label", name=f"wikimia-{length}-para") if path.exists() else None


def run_cell(loaded, ds, methods, out_dir: Path, *, n_bootstrap: int, seed: int, pass_counts: dict | None = None,
             **kwargs) -> list[dict]:
    """Score one dataset with one model in its own run folder (claimed with the cell's fingerprint, so a killed
    reproduction resumes each cell where it stopped and a changed one is refused); long-format rows
    {method, auroc, tpr_at_5pct_fpr, ...}. ``pass_counts`` receives the per-pass counts of ``runner.score_dataset``."""
    options = {k: kwargs[k] for k in ("batch_size", "chunk_size") if k in kwargs}
    fingerprint = runner.run_fingerprint(loaded, ds.texts, ds.labels, methods, ref=kwargs.get("ref"),
                                         neighbors=kwargs.get("neighbors"), data_files=ds.files, **options)
    with rundir.claim(out_dir, fingerprint, hint="use another --out") as resume:
        records = runner.score_dataset(loaded, ds.texts, methods, labels=ds.labels, out_dir=out_dir, resume=resume,
                                       report=pass_counts, **kwargs)
    summary = metrics.evaluate_records(records, methods, ds.labels, n_bootstrap=n_bootstrap, seed=seed)
    rows = [{"method": m, **summary[m]} for m in methods]
    b = blind.blind_bow_scores(ds.texts, ds.labels, seed=seed)
    rows.append({"method": blind.NAME, **metrics.evaluate(ds.labels, b, n_bootstrap=n_bootstrap, seed=seed)})
    return rows


def neighbor_kwargs(loaded, n: int, seed: int) -> dict:
    """The paper's Neighbor baseline with the target model proposing the word replacements."""
    from mia_jax.neighbors import SelfNeighbors

    return {"neighbors": SelfNeighbors(loaded, n=n, seed=seed)}


def _mean(values):
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def pivot(results: list[dict], key: str, rows: Sequence[tuple[str, str]]) -> tuple[list[str], list[list]]:
    """Table 1 / 6 layout: one row per method, one column per (model, setting), the mean of ``key`` over
    lengths, and an average column."""
    columns = list(dict.fromkeys((r["model"], r["setting"]) for r in results))
    header = ["Method"] + [f"{m} {s}" for m, s in columns] + ["Avg."]
    body = []
    for name, method in list(rows) + [(BLIND_ROW, blind.NAME)]:
        cells = [_mean(r[key] for r in results if r["method"] == method and (r["model"], r["setting"]) == c)
                 for c in columns]
        body.append([name] + cells + [_mean(cells)])
    return header, body


def markdown(header, body) -> str:
    """Best detector per column in bold (the blind row is shown but never bolded)."""
    return report.markdown(header, report.best_in_bold(body, never={BLIND_ROW}))


def write_table(out: Path, stem: str, title: str, header, body, note: str = "") -> str:
    report.write_csv(out / f"{stem}.csv", header, body)
    text = f"### {title}\n\n{markdown(header, body)}" + (f"\n{note}\n" if note else "")
    (out / f"{stem}.md").write_text(text)
    return text


def k_sweep(results: list[dict]) -> tuple[list[str], list[list]]:
    """AUROC of Min-K% and Min-K%++ for every k, per model (original setting, mean over lengths)."""
    models = list(dict.fromkeys(r["model"] for r in results))
    header = ["k"] + [f"{m} {name}" for m in models for name in ("Min-K%", "Min-K%++")]
    body = []
    for k in K_SWEEP:
        row = [k]
        for m in models:
            for base in ("min_k", "min_k_pp"):
                row.append(_mean(r["auroc"] for r in results if r["model"] == m and r["setting"] == SETTINGS[0]
                                 and r["method"] == f"{base}@{k:g}"))
        body.append(row)
    return header, body


def plot_lengths(path: Path, results: list[dict], rows: Sequence[tuple[str, str]]) -> None:
    """Figure 2b: AUROC against text length, one panel per model, original setting."""
    plt = report.pyplot()
    models = list(dict.fromkeys(r["model"] for r in results))
    lengths = sorted({r["length"] for r in results})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for name, method in list(rows) + [(BLIND_ROW, blind.NAME)]:
            ys = [_mean(r["auroc"] for r in results if r["model"] == model and r["length"] == n
                        and r["setting"] == SETTINGS[0] and r["method"] == method) for n in lengths]
            style = dict(linestyle=":", color="gray") if method == blind.NAME else {}
            ax.plot(lengths, [np.nan if y is None else y for y in ys], marker="o", label=name, **style)
        ax.axhline(0.5, color="k", linewidth=0.5)
        ax.set(title=model, xlabel="WikiMIA text length (words)", ylabel="AUROC", xscale="log", xticks=lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    report.save_figure(fig, path)


def plot_k_sweep(path: Path, header, body) -> None:
    """AUROC against k, one line per (model, method)."""
    fig, ax = report.pyplot().subplots(figsize=(6, 4))
    ks = [row[0] for row in body]
    for j, name in enumerate(header[1:], 1):
        ax.plot(ks, [np.nan if row[j] is None else row[j] for row in body], marker="o", label=name)
    ax.axhline(0.5, color="k", linewidth=0.5)
    ax.set(xlabel="k (fraction of tokens)", ylabel="AUROC", title="k sweep (original setting, mean over lengths)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    report.save_figure(fig, path)


def write_reports(out: Path, results: list[dict], rows: Sequence[tuple[str, str]] = PAPER_METHODS) -> str:
    """All tables and plots from the long-format results; returns the markdown of the tables."""
    (out / "results_long.json").write_text(json.dumps(results, indent=1))
    lengths = ", ".join(map(str, sorted({r["length"] for r in results})))
    note = (f"Mean over WikiMIA lengths {lengths}. The blind row is a bag-of-words classifier that never sees a "
            f"model (Das et al. 2024); above {blind.WARN_AUROC} it means the benchmark's members and non-members "
            "differ in distribution, and detector AUROCs overstate the membership signal.")
    parts = [write_table(out, "table1_auroc", "Table 1: AUROC", *pivot(results, "auroc", rows), note),
             write_table(out, "table6_tpr_at_5pct_fpr", "Table 6: TPR@5%FPR", *pivot(results, "tpr_at_5pct_fpr", rows),
                         note)]
    header, body = k_sweep(results)
    parts.append(write_table(out, "k_sweep", "k sweep: AUROC of Min-K% and Min-K%++", header, body))
    plot_lengths(out / "fig2b_auroc_by_length.png", results, rows)
    plot_k_sweep(out / "k_sweep.png", header, body)
    return "\n".join(parts)

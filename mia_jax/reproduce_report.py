"""The tables and plots of a WikiMIA reproduction (:mod:`mia_jax.reproduce`): Table 1 (AUROC) and Table 6
(TPR@5%FPR) as the mean over lengths with 95% bootstrap intervals and bold by the paired bootstrap, the k sweep of
Min-K% / Min-K%++ and Figure 2b, from the cells' long-format rows and per-example scores, in memory
(:func:`report_outputs`) or written (:func:`write_reports`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.evaluation import blind, report
from mia_jax.runs import files
from mia_jax.evaluation.comparisons import (compare_to_best, evaluate_mean, family_note, holm_adjust, tied_with_best,
                                 verdict_resamples)

K_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Table 1's rows: (display name, method)
PAPER_METHODS = (("Neighbor", "neighbor"), ("PPL", "loss"), ("Zlib", "zlib"), ("Lowercase", "lowercase"),
                 ("Smaller Ref", "ref"), ("Min-K% Prob", "min_k@0.2"), ("Min-K%++", "min_k_pp@0.2"))
BLIND_ROW = "Blind BoW (no model)"
SETTINGS = ("Ori.", "Para.")


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


def _column_examples(examples: dict, model: str, setting: str) -> tuple[np.ndarray, dict, list] | None:
    cells = [(length, ex) for (m, length, s), ex in sorted(examples.items(), key=lambda kv: kv[0][1])
             if m == model and s == setting]
    if not cells:
        return None
    labels = np.concatenate([ex["labels"] for _, ex in cells])
    groups = [length for length, ex in cells for _ in ex["labels"]]
    methods = set.intersection(*(set(ex["scores"]) for _, ex in cells))
    scores = {m: np.concatenate([np.asarray(ex["scores"][m], float) for _, ex in cells]) for m in methods}
    return labels, scores, groups


def table_cells(results: list[dict], key: str, rows: Sequence[tuple[str, str]], examples: dict | None = None,
                mirrored: Sequence[str] = (), *, n_bootstrap: int = 1000,
                seed: int = 0) -> tuple[list[str], list, int]:
    """Markdown cells of Table 1 / 6 and the number of paired comparisons behind its bold: the mean over lengths with
    its 95% interval (resampled within each length, from ``examples`` {(model, length, setting): {"labels",
    "scores"}}); bold: the column's best detector and every detector the paired bootstrap (at least
    ``comparisons.VERDICT_RESAMPLES`` resamples) does not place below it after Holm's correction over every
    column's comparisons; the blind row and the Smaller-Ref cells of ``mirrored`` models (marked ‡) never bold."""
    header, body = pivot(results, key, rows)
    columns = list(dict.fromkeys((r["model"], r["setting"]) for r in results))
    names = list(rows) + [(BLIND_ROW, blind.NAME)]
    out = [[name] + [report.fmt(v) for v in vals[1:]] for (name, _), vals in zip(names, body)]
    cols = [_column_examples(examples or {}, model, setting) for model, setting in columns]
    entries = []  # (column, entry, compete) of every column with a comparison: one Holm family
    for j, ((model, _), col) in enumerate(zip(columns, cols), 1):
        if col is None:
            continue
        labels, scores, groups = col
        compete = {}
        for i, (name, method) in enumerate(names):
            if method not in scores:
                continue
            try:
                r = evaluate_mean(labels, scores[method], groups, n_bootstrap=n_bootstrap, seed=seed)
            except ValueError:
                continue
            out[i][j] = report.with_ci(r[key], r[f"{key}_ci"])
            if method != blind.NAME and not (method == "ref" and model in mirrored):
                compete[method] = (i, r[key])
        if not compete or not n_bootstrap:
            continue
        entry = compare_to_best(labels, scores, {m: v for m, (_, v) in compete.items()}, key=key, groups=groups,
                                n_bootstrap=verdict_resamples(n_bootstrap), seed=seed)
        entries.append((j, entry, compete))
    family = holm_adjust([c for _, e, _ in entries if e for c in e["vs"].values()], key)
    for j, entry, compete in entries:
        for method in tied_with_best(entry, key):
            i = compete[method][0]
            out[i][j] = f"**{out[i][j]}**"
    _average_cells(out, names, cols, key, n_bootstrap=n_bootstrap, seed=seed)
    for i, (_, method) in enumerate(names):
        if method == "ref":
            for j, (model, _) in enumerate(columns, 1):
                if model in mirrored:
                    out[i][j] = out[i][j].replace("**", "") + " ‡"
            out[i][-1] = out[i][-1] + (" ‡" if mirrored else "")
    return header, out, family


def _average_cells(out: list[list], names, cols: list, key: str, *, n_bootstrap: int, seed: int) -> None:
    """The "Avg." cell of each row (the last) with its 95% interval: one bootstrap of the texts shared by every
    column (resampled within each length, each resample applied to every column), so the mean over models carries
    an interval that accounts for the models scoring the same texts. Left as the point estimate where the columns
    do not hold the same texts (different labels or lengths) or a column has no per-example scores."""
    if not n_bootstrap or not cols or any(c is None for c in cols):
        return
    labels, _, groups = cols[0]
    if any(not np.array_equal(c[0], labels) or list(c[2]) != list(groups) for c in cols[1:]):
        return
    for i, (_, method) in enumerate(names):
        if any(method not in c[1] for c in cols):
            continue
        try:
            r = evaluate_mean(labels, np.stack([c[1][method] for c in cols]), groups,
                                      n_bootstrap=n_bootstrap, seed=seed)
        except ValueError:
            continue
        out[i][-1] = report.with_ci(r[key], r[f"{key}_ci"])


def write_table(outputs: dict, stem: str, title: str, header, body, note: str = "", cells=None) -> str:
    """Table ``stem`` (.csv and .md) into ``outputs`` ({file name: content}); returns its markdown."""
    outputs[f"{stem}.csv"] = report.csv_bytes(header, body)
    md = report.markdown(header, cells) if cells is not None else markdown(header, body)
    text = f"### {title}\n\n{md}" + (f"\n{note}\n" if note else "")
    outputs[f"{stem}.md"] = text.encode("utf-8")
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


def k_sweep_cells(models: list[str], body: list[list], examples: dict, *, n_bootstrap: int, seed: int) -> list[list]:
    """The cells of :func:`k_sweep`'s ``body`` (columns: Min-K%, Min-K%++ per model of ``models``) as markdown with
    95% intervals (:func:`evaluate_mean` over the lengths of the original setting); the point estimate alone
    where a column has no per-example scores."""
    cols = {m: _column_examples(examples, m, SETTINGS[0]) for m in models}
    out = []
    for row in body:
        k, cells = row[0], [str(row[0])]
        for j, value in enumerate(row[1:]):
            model, method = models[j // 2], f"{('min_k', 'min_k_pp')[j % 2]}@{k:g}"
            col, cell = cols[model], report.fmt(value)
            if col is not None and method in col[1] and n_bootstrap:
                try:
                    r = evaluate_mean(col[0], col[1][method], col[2], n_bootstrap=n_bootstrap, seed=seed)
                    cell = report.with_ci(r["auroc"], r["auroc_ci"])
                except ValueError:
                    pass
            cells.append(cell)
        out.append(cells)
    return out


def plot_lengths(results: list[dict], rows: Sequence[tuple[str, str]]) -> bytes:
    """Figure 2b: AUROC against text length, one panel per model, original setting (PNG bytes)."""
    plt = report.pyplot()
    models = list(dict.fromkeys(r["model"] for r in results))
    lengths = sorted({r["length"] for r in results})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        drawn = False
        for name, method in list(rows) + [(BLIND_ROW, blind.NAME)]:
            ys = [_mean(r["auroc"] for r in results if r["model"] == model and r["length"] == n
                        and r["setting"] == SETTINGS[0] and r["method"] == method) for n in lengths]
            style = dict(linestyle=":", color="gray") if method == blind.NAME else {}
            ax.plot(lengths, [np.nan if y is None else y for y in ys], marker="o", label=name, **style)
            drawn = drawn or any(y is not None for y in ys)
        if not drawn:  # every AUROC n/a (too few examples): no data to place the log axis
            ax.set_xlim(min(lengths) / 1.25, max(lengths) * 1.25)
            ax.set_ylim(0, 1)
            ax.text(0.5, 0.5, "n/a: too few examples", transform=ax.transAxes, ha="center", color="gray")
        ax.axhline(0.5, color="k", linewidth=0.5)
        ax.set(title=model, xlabel="WikiMIA text length (words)", ylabel="AUROC", xscale="log", xticks=lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    return report.figure_bytes(fig)


def plot_k_sweep(header, body) -> bytes:
    """AUROC against k, one line per (model, method) (PNG bytes)."""
    fig, ax = report.pyplot().subplots(figsize=(6, 4))
    ks = [row[0] for row in body]
    for j, name in enumerate(header[1:], 1):
        ax.plot(ks, [np.nan if row[j] is None else row[j] for row in body], marker="o", label=name)
    ax.axhline(0.5, color="k", linewidth=0.5)
    ax.set(xlabel="k (fraction of tokens)", ylabel="AUROC", title="k sweep (original setting, mean over lengths)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return report.figure_bytes(fig)


def write_reports(out: Path, results: list[dict], rows: Sequence[tuple[str, str]] = PAPER_METHODS,
                  examples: dict | None = None, mirrored: Sequence[str] = (), *, n_bootstrap: int = 1000,
                  seed: int = 0) -> str:
    """:func:`report_outputs` written into ``out`` (all files or none); returns the markdown of the tables."""
    text, outputs = report_outputs(results, rows, examples, mirrored, n_bootstrap=n_bootstrap, seed=seed)
    files.write_all(out, outputs)
    return text


def _missing_note(results: list[dict], key: str, methods: set) -> str:
    """The reason of every n/a value of ``key`` among ``methods`` (a table's rows) and the count of excluded
    (NaN/inf) scores, or ''."""
    parts = []
    why = {}
    for r in results:
        if r.get(key) is None and r["method"] in methods:
            why.setdefault(r.get("note") or "no value", []).append(f"{r['model']} {r['setting']} {r['length']}")
    for reason, where in why.items():
        cells = list(dict.fromkeys(where))
        parts.append(f"n/a ({', '.join(cells[:6])}{' ...' if len(cells) > 6 else ''}): {reason}")
    nan = {}
    for r in results:
        if r.get("n_nan") and r["method"] in methods:
            nan[f"{r['model']} {r['setting']} {r['length']} {r['method']}"] = r["n_nan"]
    if nan:
        shown = ", ".join(f"{k}: {v}" for k, v in list(nan.items())[:12])
        parts.append(f"Scores that are NaN/inf, excluded from the metrics: {shown}{' ...' if len(nan) > 12 else ''}.")
    return " ".join(parts)


def report_outputs(results: list[dict], rows: Sequence[tuple[str, str]] = PAPER_METHODS,
                   examples: dict | None = None, mirrored: Sequence[str] = (), *, n_bootstrap: int = 1000,
                   seed: int = 0) -> tuple[str, dict[str, str | bytes]]:
    """All tables and plots from the long-format results, in memory: (the markdown of the tables, {file name:
    content}). With ``examples`` ({(model, length, setting): {"labels", "scores"}}) every Table 1 / 6 cell carries
    its 95% interval and bold follows the paired bootstrap (:func:`table_cells`); ``mirrored``: models whose
    Smaller-Ref pair is mirrored. A cell without a value (too few examples of a class) is n/a, its reason in the
    table's note, never bold; NaN/inf scores are counted in the note."""
    outputs: dict[str, str | bytes] = {"results_long.json": json.dumps(results, indent=1).encode("utf-8")}
    lengths = ", ".join(map(str, sorted({r["length"] for r in results})))
    note = (f"Mean over WikiMIA lengths {lengths}. The blind row is a bag-of-words classifier that never sees a "
            f"model (Das et al. 2024); above {blind.WARN_AUROC} it means the benchmark's members and non-members "
            "differ in distribution, and detector AUROCs overstate the membership signal.")
    if examples:
        note += (" Cells: mean [95% bootstrap CI, resampled within each length]; bold: the column's best detector and "
                 "every detector the paired bootstrap on the same texts does not distinguish from it. Avg.: the mean "
                 "over the columns, its interval from one bootstrap of the texts shared by every column (not bolded).")
    units = {r["model"]: r.get("ref_unit") for r in results if r["method"] == "ref" and r.get("ref_unit")}
    if any(u == "byte" for u in units.values()):
        note += (" Smaller Ref of " + ", ".join(m for m, u in units.items() if u == "byte") + ": the tokenizers of "
                 "target and reference differ, so the two are compared per byte of text (total log-likelihood / "
                 "UTF-8 bytes), not per token.")
    if mirrored:
        note += (" ‡ Mirrored Smaller-Ref pair (" + ", ".join(mirrored) + " are each other's reference): the two "
                 "cells are one score negated (AUROCs sum to 1), not independent evidence; never bolded.")
    kw = dict(n_bootstrap=n_bootstrap, seed=seed)
    parts = []
    for stem, title, key in (("table1_auroc", "Table 1: AUROC", "auroc"),
                             ("table6_tpr_at_5pct_fpr", "Table 6: TPR@5%FPR", "tpr_at_5pct_fpr")):
        extra = _missing_note(results, key, {m for _, m in rows} | {blind.NAME})
        _, cells, family = table_cells(results, key, rows, examples, mirrored, **kw) if examples or mirrored \
            else (None, None, 0)
        if examples:
            extra = " ".join(x for x in (extra, family_note(family, "each column's best against every other detector"))
                             if x)
        parts.append(write_table(outputs, stem, title, *pivot(results, key, rows),
                                 note + (f" {extra}" if extra else ""), cells=cells))
    header, body = k_sweep(results)
    models = list(dict.fromkeys(r["model"] for r in results))
    cells = k_sweep_cells(models, body, examples, **kw) if examples else None
    sweep_note = ("Original setting, mean over lengths [95% bootstrap CI, resampled within each length]; not bolded "
                  "(every k is scored on the same texts: compare the intervals with care)." if cells else "")
    extra = _missing_note([r for r in results if r["setting"] == SETTINGS[0]], "auroc",
                          {f"{base}@{k:g}" for base in ("min_k", "min_k_pp") for k in K_SWEEP})
    sweep_note = " ".join(x for x in (sweep_note, extra) if x)
    parts.append(write_table(outputs, "k_sweep", "k sweep: AUROC of Min-K% and Min-K%++", header, body, sweep_note,
                             cells=cells))
    outputs["fig2b_auroc_by_length.png"] = plot_lengths(results, rows)
    outputs["k_sweep.png"] = plot_k_sweep(header, body)
    return "\n".join(parts), outputs

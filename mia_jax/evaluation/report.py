"""Reports: markdown / CSV / JSON summary tables and ROC / score-histogram plots, and the table and plot helpers
every report of the package is written with (``fmt``, ``markdown``, ``best_in_bold``, ``write_csv``, ``pyplot``,
``save_figure``: also used by ``reproduce_report`` and ``train/tables``).

``summary`` arguments are ``{method: metrics.evaluate(...) dict}``; rows keep the dict's order.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Collection, Sequence

import numpy as np

from mia_jax.evaluation import metrics, rounding
from mia_jax.evaluation.bootstrap import as_labels, as_scores, tpr_key
from mia_jax.evaluation.comparisons import describe

COLUMNS = ["method", "auroc", "auroc_ci", "tpr_at_5pct_fpr", "tpr_at_5pct_fpr_ci", "tpr_at_1pct_fpr",
           "fpr_at_95pct_tpr", "best_balanced_accuracy", "n_scored", "n_nan"]
_HEADER = ["Method", "AUROC [95% CI]", "TPR@5%FPR [95% CI]", "TPR@1%FPR", "FPR@95%TPR",
           "Best bal. acc.", "n (NaN)"]


# ----------------------------------------------------------------------------- table and plot helpers


fmt = rounding.fmt  # the one rounding of every printed number (rounding.py): three decimals, n/a for None/NaN


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table of ready-made cells: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def best_in_bold(rows: Sequence[Sequence], *, never: Collection = (), shown_ties: bool = False) -> list[list[str]]:
    """Rows ``[label, value, ...]`` as cells: values through :func:`fmt`, the largest of each column in bold (every
    tie: equal values or, with ``shown_ties``, values that look equal); rows labelled in ``never`` (a baseline)
    are shown but neither compete nor get bold."""
    out = [[str(r[0])] + [fmt(v) for v in r[1:]] for r in rows]
    compete = [i for i, r in enumerate(rows) if r[0] not in never]
    for j in range(1, max((len(r) for r in rows), default=0)):
        col = [rows[i][j] for i in compete if rows[i][j] is not None]
        best = max(col, default=None)
        for i in compete:
            v = rows[i][j]
            if v is not None and best is not None and (fmt(v) == fmt(best) if shown_ties else v == best):
                out[i][j] = f"**{out[i][j]}**"
    return out


def csv_bytes(header: Sequence[str], rows: Sequence[Sequence]) -> bytes:
    """A CSV file's bytes: the header, then the rows (None as an empty cell), UTF-8, CRLF line ends (what
    :func:`write_csv` writes; in memory, for the reports that write their files together)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def write_csv(path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """A CSV file in UTF-8: the header, then the rows (None as an empty cell): :func:`csv_bytes` written."""
    Path(path).write_bytes(csv_bytes(header, rows))


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (files only, no display needed)."""
    import matplotlib  # ~0.6 s with pyplot: only when a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg")
    return plt


def save_figure(fig, path, dpi: int = 120, tight: bool = True) -> None:
    """Save a figure (laid out with ``tight_layout`` unless ``tight`` is False) and close it."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def figure_bytes(fig, dpi: int = 120, tight: bool = True) -> bytes:
    """A figure's PNG bytes as :func:`save_figure` writes them, in memory (for the reports that write their files
    together); the figure is closed."""
    buf = io.BytesIO()
    save_figure(fig, buf, dpi=dpi, tight=tight)
    return buf.getvalue()


# ----------------------------------------------------------------------------- the summary of one run


def with_ci(x, ci, bold: bool = False) -> str:
    """A value as every report shows it with its interval: ``0.653 [0.618, 0.691]`` (n/a when None; no brackets
    without an interval), the value in bold with ``bold``."""
    s = fmt(x)
    if bold and x is not None:
        s = f"**{s}**"
    if x is not None and ci is not None:
        s += f" [{fmt(ci[0])}, {fmt(ci[1])}]"
    return s


def markdown_table(summary: dict[str, dict], bold: Collection = ()) -> str:
    """GitHub markdown table, one row per method, None as n/a; the AUROC of the methods in ``bold`` in bold (for
    a run: :func:`comparisons.tied_with_best`, the best and every method the paired bootstrap does not place below it;
    nothing is bolded on a point estimate alone)."""
    rows = []
    for method, r in summary.items():
        n = r.get("n_scored")
        cells = [
            str(method).replace("|", "\\|"),
            with_ci(r.get("auroc"), r.get("auroc_ci"), bold=method in bold),
            with_ci(r.get("tpr_at_5pct_fpr"), r.get("tpr_at_5pct_fpr_ci")),
            fmt(r.get("tpr_at_1pct_fpr")),
            fmt(r.get("fpr_at_95pct_tpr")),
            fmt(r.get("best_balanced_accuracy")),
            f"{'n/a' if n is None else n} ({r.get('n_nan', 0)})",
        ]
        rows.append(cells)
    return markdown(_HEADER, rows)


def na_note(summary: dict[str, dict], key: str = "auroc") -> str | None:
    """Why the table's n/a cells are n/a: one sentence per reason (each metric's ``note``), naming its methods;
    None when no row's ``key`` is n/a.

    >>> na_note({"loss": {"auroc": None, "note": "one class"}, "zlib": {"auroc": 0.5}, "ppl": {"note": "one class"}})
    'n/a (loss, ppl): one class.'
    """
    why: dict[str, list[str]] = {}
    for method, r in summary.items():
        if r.get(key) is None:
            reason = (r.get("note") or "no value").removeprefix("n/a: ")
            why.setdefault(reason, []).append(str(method))
    return " ".join(f"n/a ({', '.join(ms)}): {reason.rstrip('.')}." for reason, ms in why.items()) or None


def jsonable(x):
    """``x`` made fit for strict JSON: dict keys as strings, tuples and arrays as lists, NumPy scalars as Python
    numbers, NaN/inf as None, paths as strings (nested values too); other values unchanged."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None  # strict JSON has no NaN/inf
    if isinstance(x, Path):
        return str(x)
    return x


def _csv_header() -> list[str]:
    return [h for c in COLUMNS for h in ((f"{c}_lo", f"{c}_hi") if c.endswith("_ci") else (c,))]


def _csv_row(method: str, r: dict) -> list:
    row = []
    for c in COLUMNS:
        if c == "method":
            row.append(method)
        elif c.endswith("_ci"):
            ci = r.get(c) or (None, None)
            row += ["" if v is None else repr(float(v)) for v in ci]
        else:
            v = r.get(c)
            row.append("" if v is None else (repr(float(v)) if isinstance(v, float) else v))
    return row


def _signed_ci(c: dict) -> str:
    return rounding.diff_ci(c["diff"], c["ci"])


def comparisons_markdown(comparisons: Sequence[dict]) -> str:
    """The paired comparisons (``{"a": name, "b": name, **comparisons.paired_bootstrap(...)}``, or with ``"error"``)
    as a markdown table: A - B per metric with its interval and verdict, then one sentence per comparison."""
    if not comparisons:
        return ""
    tpr = tpr_key(0.05)
    rows, lines = [], []
    for c in comparisons:
        a, b = (str(c[k]).replace("|", "\\|") for k in ("a", "b"))
        if "error" in c:
            rows.append([a, b, "n/a", "n/a", "n/a", "n/a"])
            lines.append(f"{c['a']} vs {c['b']}: not computed ({c['error']})")
            continue
        rows.append([a, b, _signed_ci(c["auroc"]), c["auroc"]["verdict"], _signed_ci(c[tpr]), c[tpr]["verdict"]])
        lines.append(describe(c, c["a"], c["b"]))
    pct = f"{comparisons[0].get('confidence', 0.95):.0%}"
    header = ["A", "B", f"AUROC A - B [{pct} CI]", "AUROC verdict", f"TPR@5%FPR A - B [{pct} CI]", "TPR verdict"]
    n = sum(1 for c in comparisons if "error" not in c)
    return ("Paired comparisons (bootstrap of the difference on the same texts; the intervals unadjusted; a verdict "
            f"only where the Holm-adjusted p over these {n} comparisons, per metric, is below 0.05):\n\n"
            + markdown(header, rows) + "\n" + "\n".join(f"- {line}" for line in lines) + "\n")


def write_summary(out_dir, summary: dict[str, dict], extra: dict | None = None, notes: Sequence[str] = (),
                  comparisons: Sequence[dict] = (), bold: Collection = ()) -> None:
    """Write ``summary.json`` ({method: metrics}), ``summary.csv`` (COLUMNS, CIs split into ``*_lo`` /
    ``*_hi``, empty cell for None), ``summary.md`` (:func:`markdown_table`) and, if ``extra`` is given,
    ``run.json`` with it (config, model, data hashes, ...); ``notes`` are lines appended below the
    markdown table. ``comparisons`` (paired bootstraps, see :func:`comparisons_markdown`) go under the notes in
    ``summary.md`` and into ``summary.json`` as ``"comparisons": [...]`` (absent without comparisons); ``bold``:
    as in :func:`markdown_table`. Creates ``out_dir`` if needed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blob = dict(summary, comparisons=list(comparisons)) if comparisons else summary
    (out / "summary.json").write_text(json.dumps(jsonable(blob), indent=2, allow_nan=False) + "\n")
    write_csv(out / "summary.csv", _csv_header(), [_csv_row(str(method), r) for method, r in summary.items()])
    (out / "summary.md").write_text(markdown_table(summary, bold) + "".join(f"\n{n}\n" for n in notes)
                                    + (f"\n{comparisons_markdown(comparisons)}" if comparisons else ""))
    if extra is not None:
        (out / "run.json").write_text(json.dumps(jsonable(extra), indent=2, allow_nan=False) + "\n")


def _finite_rows(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    lab = as_labels(labels)
    sc = as_scores(scores, lab.shape[0])
    keep = np.isfinite(sc)
    return lab[keep], sc[keep]


def plot_roc(path, curves: dict, title: str = "") -> None:
    """ROC curves ``{method: (labels, scores)}``: linear axes (left) and log-scale FPR from 1e-3 (right).

    NaN/inf rows are dropped per method; methods left with a single class are skipped and listed in the
    figure. AUROC is in the legend. Saved as PNG at 120 dpi."""
    plt = pyplot()
    fig, (ax_lin, ax_log) = plt.subplots(1, 2, figsize=(11, 4.8))
    skipped = []
    for method, (labels, scores) in curves.items():
        lab, sc = _finite_rows(labels, scores)
        if lab.size == 0 or lab.min() == lab.max():
            skipped.append(str(method))
            continue
        fpr, tpr, _ = metrics.roc_curve(lab, sc)
        label = f"{method} (AUROC {fmt(metrics.auroc(lab, sc))})"
        (line,) = ax_lin.plot(fpr, tpr, lw=1.5, label=label)
        # FPR = 0 cannot be drawn on a log axis: clip it just left of the visible range.
        ax_log.step(np.maximum(fpr, 1e-4), tpr, where="post", lw=1.5, color=line.get_color(), label=label)
    chance = np.logspace(-4, 0, 200)
    for ax in (ax_lin, ax_log):
        ax.plot(chance, chance, ls="--", lw=0.8, color="grey")
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    ax_lin.set_xlim(0, 1)
    ax_lin.set_title("ROC")
    ax_log.set_xscale("log")
    ax_log.set_xlim(1e-3, 1)
    ax_log.set_title("ROC, log-scale FPR")
    if ax_lin.get_legend_handles_labels()[0]:
        ax_lin.legend(loc="lower right", fontsize=8)
    if skipped:
        fig.text(0.01, 0.01, "skipped (single class or no finite scores): " + ", ".join(skipped), fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04 if skipped else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_histograms(path, scores_by_method: dict, labels) -> None:
    """Member vs non-member score histograms (densities on shared bins), one panel per method in a grid.

    ``labels`` is shared by all methods; NaN/inf scores are excluded per method (count in the title)."""
    plt = pyplot()
    n = max(1, len(scores_by_method))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3 * nrows), squeeze=False)
    for ax, (method, scores) in zip(axes.flat, scores_by_method.items()):
        lab, sc = _finite_rows(labels, scores)
        n_bad = len(np.asarray(scores)) - sc.size
        ax.set_title(f"{method}" + (f" ({n_bad} NaN/inf excluded)" if n_bad else ""), fontsize=9)
        if sc.size == 0:
            ax.text(0.5, 0.5, "no finite scores", ha="center", va="center", transform=ax.transAxes)
            continue
        bins = np.histogram_bin_edges(sc, bins=30)
        for value, name, color in ((0, "non-member", "tab:blue"), (1, "member", "tab:orange")):
            part = sc[lab == value]
            if part.size:
                ax.hist(part, bins=bins, density=True, alpha=0.5, color=color, histtype="stepfilled",
                        label=f"{name} ({part.size})")
        ax.set_xlabel("score (higher = member)", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(scores_by_method):]:
        ax.axis("off")
    save_figure(fig, path)


def nonfinite_warning(indices) -> str | None:
    """The warning a command prints under its table when the model's logits were NaN or infinite for the texts at
    ``indices`` (None when there are none)."""
    if not indices:
        return None
    return (f"WARNING: the model's logits are NaN or infinite for {len(indices)} texts (the first: text "
            f"{indices[0]}); every score of those texts is null and they are left out of every metric. A broken "
            "checkpoint or a bfloat16 overflow: check the model, or try --dtype float32.")

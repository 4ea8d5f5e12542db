"""The paper's contamination tables and figures as markdown / CSV / PNG, rebuilt from per-example scores.

Every run writes ``examples.jsonl.gz`` (one JSON object per eval example: the corpus's eval fields but the text,
``text_sha256``, the blind-baseline score and every method's score under the trained and the base model) beside
``run.json``; every table and figure of the run, or of a sweep of runs, is a function of those files alone::

    python -m train.tables --from results/contamination/lr     # a sweep folder, or one run's folder

* Table 3: AUROC [95% CI] per dataset and the average, reference-free methods after continued pretraining with
  the base model's AUROC beside each; the oracle reference (``ref`` = trained minus base log-likelihood, which
  needs the pre-contamination checkpoint) in its own block, never bolded; the model-free blind baseline per
  dataset; the gain over the base model as a paired bootstrap of trained vs base on the same examples.
  Bold = the best method of a column and every method the paired bootstrap cannot distinguish from it.
* Table 7: the same for TPR@5%FPR.
* Table 4: AUROC [95% CI] per dataset for each learning rate (Min-K% first, then PPL and Min-K%++), with the
  paired comparison of the learning rates on the same examples.
* Figure 5a / 5b: Min-K% AUROC against the contamination rate (% of corpus tokens) over background sizes.
* Figure 5c: AUROC of the members inserted k times against all non-members, per k, with the comparison of the
  largest k against k = 1 (the same non-members, :func:`mia_jax.metrics.subset_bootstrap`).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from mia_jax import blind, entry, files, metrics, rundir
from mia_jax.errors import UserError
from mia_jax.report import markdown, pyplot, with_ci

PROG = "python -m train.tables"

EXAMPLES = "examples.jsonl.gz"
RUN = "run.json"
RUN_FILES = (RUN, EXAMPLES)  # what a rebuild reads of a run: sealed at the run's end (rundir.seal)
DATASET_NAMES = {"boolq": "BoolQ", "commonsenseqa": "CommonsenseQA", "imdb": "IMDB", "truthfulqa": "TruthfulQA",
                 "news": "News 2023"}
BASE_NAMES = {"loss": "Loss", "ppl": "PPL", "zlib": "Zlib", "lowercase": "Lowercase", "entropy": "Entropy",
              "rank": "Rank", "ref": "Ref (base model as reference)", "min_k": "Min-K% Prob", "min_k_pp": "Min-K%++",
              "max_k": "Max-K%", "neighbor": "Neighbor"}
HEADLINE = ("min_k", "ppl", "min_k_pp")  # Table 4 / Figure 5 methods, in this order
ORACLE = ("ref",)  # methods that need the pre-contamination checkpoint: their own block, never bolded
AVG = "avg"
NEIGHBOR_NOTE = ("Neighbor: the base model proposes each neighbour's word replacements (`neighbors.SelfNeighbors`, "
                 "as `mia-jax eval` without --neighbor-mlm; no offline mask-filling model is available), the same "
                 "neighbours for the base and the trained model.")
NO_NEIGHBOR_NOTE = ("Neighbor: not run (add `neighbor` to score.methods; the base model then proposes the "
                    "neighbours, no offline mask-filling model being available).")


def rebuild_line(what: str = "<this folder>") -> str:
    return (f"Rebuilt from the per-example scores ({EXAMPLES}) by `python -m train.tables --from {what}`; "
            "intervals: 95% stratified bootstrap; comparisons: paired bootstrap on the same examples.\n\n")


def method_name(method: str) -> str:
    base, _, k = method.partition("@")
    name = BASE_NAMES.get(base, base)
    return f"{name} (k={float(k):.0%})" if k else name


def headline(methods, base: str = "min_k") -> str | None:
    return next((m for m in methods if m.partition("@")[0] == base), None)


def _avg(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals and len(vals) == len(values) else None


def reason(r: dict | None) -> str | None:
    """Why a cell is n/a (a class with fewer than metrics.MIN_PER_CLASS examples, one class left, ...), from its
    ``note``; None when it has no note."""
    return r["note"].replace("n/a: ", "") if r and r.get("note") else None


def _na(why: str | None) -> str:
    return f"n/a ({why})" if why else "n/a"


def _ci_cell(r: dict | None, key: str) -> str:
    """``value [lo, hi]``; n/a with the reason (``note``) when the metric could not be computed."""
    if r is None:
        return "n/a"
    if r.get(key) is None:
        return _na(reason(r))
    return with_ci(r.get(key), r.get(f"{key}_ci"))


def _nan_cell(cells: list) -> str:
    """``n (NaN)`` over a row's cells (metrics.evaluate dicts): scored examples and NaN/inf scores excluded."""
    cells = [c for c in cells if c and "n_scored" in c]
    return f"{sum(c['n_scored'] for c in cells)} ({sum(c.get('n_nan') or 0 for c in cells)})"


def _any_nan(cells) -> bool:
    return any(c and (c.get("n_nan") or 0) > 0 for c in cells)


def csv_text(header, rows) -> bytes:
    """A CSV file's bytes as ``report.write_csv`` writes it (UTF-8, None as an empty cell)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def figure_bytes(fig, dpi: int = 120, tight: bool = True) -> bytes:
    """A figure's PNG bytes as ``report.save_figure`` writes them (the file is written with the other outputs)."""
    if tight:
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    pyplot().close(fig)
    return buf.getvalue()


def _num(v) -> float:
    return np.nan if v is None else v


# ----------------------------------------------------------------------------- per-example records


def example_rows(eval_set: list[dict], trained: list[dict], base: list[dict], seed: int = 0) -> list[dict]:
    """One row per eval example: its eval fields except the text, ``text_sha256``, ``blind`` (the out-of-fold score
    of the blind baseline fitted on its dataset's texts alone, null when the dataset is too small) and ``trained`` /
    ``base``: {method: score or null} from the two models' scoring records."""
    rows = []
    for e, t, b in zip(eval_set, trained, base, strict=True):
        row = {k: v for k, v in e.items() if k != "text"}
        row["text_sha256"] = hashlib.sha256(e["text"].encode("utf-8")).hexdigest()
        row.update(n_tokens=t.get("n_tokens"), blind=None, trained=t["scores"], base=b["scores"])
        rows.append(row)
    for d, idx in _by_dataset(rows).items():
        try:
            scores = blind.blind_bow_scores([eval_set[i]["text"] for i in idx], [rows[i]["label"] for i in idx],
                                            seed=seed)
        except Exception:  # noqa: BLE001 - too few examples for the cross-validation: no blind score
            continue
        for i, s in zip(idx, scores):
            rows[i]["blind"] = float(s)
    return rows


def write_examples(path: Path, rows: list[dict]) -> None:
    """``rows`` as gzip-compressed JSONL, byte-identical for the same rows (``files.write_jsonl_gz``)."""
    files.write_jsonl_gz(path, rows)


def read_examples(path: Path) -> list[dict]:
    return files.read_jsonl_gz(path)


def _by_dataset(rows: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        out.setdefault(r["dataset"], []).append(i)
    return out


def _vec(rows: list[dict], model: str, method: str) -> np.ndarray:
    vals = [r[model].get(method) if model != "blind" else r["blind"] for r in rows]
    return np.array([np.nan if v is None else v for v in vals], np.float64)


# ----------------------------------------------------------------------------- the metrics of one run


def run_results(rows: list[dict], methods: list[str], base_methods: list[str], *, n_bootstrap: int = 1000,
                seed: int = 0) -> dict:
    """Everything the tables of one run show, from its example rows:

    ``trained`` / ``base``: {dataset: {method: metrics.evaluate}}; ``blind``: {dataset: metrics.evaluate or None};
    ``average``: {model: {method: metrics.evaluate_mean over datasets}}; ``gain``: {dataset or "avg": {method:
    paired_bootstrap(trained, base)}}; ``best``: {model: {"auroc" | "tpr_at_5pct_fpr": {dataset or "avg":
    {"best": method, "vs": {method: paired_bootstrap(best, method)}}}}} over the reference-free methods."""
    groups = _by_dataset(rows)
    labels = np.array([r["label"] for r in rows])
    dsets = [r["dataset"] for r in rows]
    kw = dict(n_bootstrap=n_bootstrap, seed=seed)
    res: dict = {"trained": {}, "base": {}, "blind": {}, "average": {"trained": {}, "base": {}}, "gain": {},
                 "best": {}}
    vec = {model: {m: _vec(rows, model, m) for m in ms} for model, ms in (("trained", methods), ("base", base_methods))}
    for d, idx in groups.items():
        for model, ms in (("trained", methods), ("base", base_methods)):
            res[model][d] = {m: metrics.evaluate(labels[idx], vec[model][m][idx], **kw) for m in ms}
        b = _vec([rows[i] for i in idx], "blind", "")
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
    return res


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
    with_nan = _any_nan(results[model][d].get(m) for d in datasets for m in methods)
    if with_nan:
        header.append("n (NaN)")
    rows = []
    for m in methods:
        row = [method_name(m)]
        bold = [m in _bold_set(results, model, key, c) and m not in ORACLE for c in cols]
        for c, b in zip(cols, bold):
            cell = _ci_cell(_column(results, model, c, m), key)
            row.append(f"**{cell}**" if b and not cell.startswith("n/a") else cell)
            if model == "trained":
                base = _column(results, "base", c, m) if m in results["base"][datasets[0]] else None
                row.append(_ci_cell(base, key))
        if with_nan:
            row.append(_nan_cell([results[model][d].get(m) for d in datasets]))
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
                    out.append(f"{model} model, {where}: {_na(why)}")
                continue
            ranked = sorted(((c[key]["diff"], m, c) for m, c in entry["vs"].items() if c is not None),
                            key=lambda t: t[0])
            best = method_name(entry["best"])
            if not ranked:
                out.append(f"{model}, {where}: best reference-free {label}: {best} (no other method to compare)")
                continue
            _, runner, c = ranked[0]
            verdict = ("best reference-free method" if c[key]["verdict"] == "A > B"
                       else "highest point estimate, not distinguishable from the runner-up")
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
            _ci_cell(results["blind"].get(d), key) if results["blind"].get(d) is not None
            else "n/a (too few examples for the blind baseline's cross-validation)" for d in datasets]
        parts.append(f"{title} of the model-free blind baseline ({blind.NAME}, bag-of-words, {blind.FOLDS}-fold "
                     "CV within each dataset's split): a split it separates is separable without a model.\n\n"
                     + markdown(["Baseline", *(DATASET_NAMES.get(d, d) for d in datasets)], [blind_row]))
        warns = [f"WARNING: {DATASET_NAMES.get(d, d)}: blind baseline AUROC {r['auroc']:.3f} > {blind.WARN_AUROC}: "
                 "members and non-members differ in distribution; detector AUROCs on it overstate the signal."
                 for d, r in results["blind"].items()
                 if r is not None and r.get("auroc") is not None and r["auroc"] > blind.WARN_AUROC]
        parts += [w + "\n" for w in warns]
        gain_rows = []
        for m in [m for m in methods if m in results["base"][datasets[0]]]:
            cells = []
            for c in [*datasets, AVG]:
                g = results.get("gain", {}).get(c, {}).get(m)
                cells.append(_na(reason(_column(results, "trained", c, m)) or reason(_column(results, "base", c, m)))
                             if g is None else f"{g[key]['diff']:+.3f} [{g[key]['ci'][0]:+.3f}, "
                             f"{g[key]['ci'][1]:+.3f}]" + ("" if g[key]["verdict"] != "not distinguishable" else " ~"))
            gain_rows.append([method_name(m), *cells])
        parts.append(f"{title} gain over the base model (trained - base, paired bootstrap on the same examples; "
                     "~ = not distinguishable from 0):\n\n"
                     + markdown(["Method", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."], gain_rows))
        parts.append("Comparisons (paired bootstrap; a method is called best only where the interval of its "
                     "difference with the runner-up excludes 0):\n\n"
                     + "".join(f"- {s}\n" for s in _statements(results, key, title)))
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
        outputs[f"{name}.csv"] = csv_text(
            ["model", "dataset", "method", key, f"{key}_ci_lo", f"{key}_ci_hi", "n_members", "n_nonmembers"], csv_rows)
    return outputs


def roc_figure(rows: list[dict], methods: list[str]) -> bytes:
    """roc.png: one panel per dataset, ROC curves of the headline methods for the trained model (a method with
    fewer than metrics.MIN_PER_CLASS scored examples of a class in a dataset is left out of its panel)."""
    shown = [m for m in methods if m.partition("@")[0] in (*HEADLINE, "zlib", "lowercase", "ref", "neighbor")]
    groups = _by_dataset(rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.6), squeeze=False)
    for ax, (d, idx) in zip(axes[0], groups.items()):
        sub = [rows[i] for i in idx]
        labels = np.array([r["label"] for r in sub])
        for m in shown:
            sc = _vec(sub, "trained", m)
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
        outputs.update(occurrence_figure(*_records_and_eval(rows), methods))
    return results, outputs


def write_run(out: Path, rows: list[dict], info: dict) -> dict:
    """:func:`run_outputs` written into ``out`` (all or none); returns the results."""
    results, outputs = run_outputs(rows, info)
    files.write_all(out, outputs)
    return results


def _records_and_eval(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    return [{"scores": r["trained"]} for r in rows], rows


# ----------------------------------------------------------------------------- ablations


def _examples_of(res: dict) -> list[dict] | None:
    return res.get("examples") if isinstance(res, dict) else None


def _bootstrap_cfg(res: dict) -> tuple[int, int]:
    """(n_bootstrap, seed) of a run's config.score (results returned by run_experiment / rebuild_run carry it)."""
    score = res.get("config", {}).get("score", {})
    return int(score.get("n_bootstrap", 1000)) or 1000, int(score.get("seed", 0))


def _same_examples(a: list[dict] | None, b: list[dict] | None) -> bool:
    return bool(a) and bool(b) and [(r["dataset"], r["label"], r["text_sha256"]) for r in a] == \
        [(r["dataset"], r["label"], r["text_sha256"]) for r in b]


def _paired_models(rows_a: list[dict], rows_b: list[dict], m: str, n_bootstrap: int, seed: int) -> dict:
    """{dataset or "avg": paired_bootstrap of method ``m``'s trained scores of run A vs run B (same examples), or
    the reason it is n/a (a class with fewer than metrics.MIN_PER_CLASS examples)}."""
    labels = np.array([r["label"] for r in rows_a])
    a, b = _vec(rows_a, "trained", m), _vec(rows_b, "trained", m)
    cols = {d: (idx, None) for d, idx in _by_dataset(rows_a).items()}
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
                   + (_na(c) if isinstance(c, str) else metrics.describe(c, name_a, name_b)) + "\n"
                   for d, c in comp.items())


def table4(runs: dict[float, dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Table 4 from {lr: results of that run} (with ``examples``: the paired comparison of the learning rates,
    largest vs smallest, with the runs' score.n_bootstrap and seed): (markdown, {file name: content})."""
    n_bootstrap, seed = _bootstrap_cfg(next(iter(runs.values())))
    datasets = list(next(iter(runs.values()))["trained"])
    parts, rows_csv = [f"# Table 4: AUROC [95% CI] per learning rate\n\n{rebuild_line()}"], []
    lrs = sorted(runs)
    for base in HEADLINE:
        m = headline(methods, base)
        if m is None:
            continue
        rows = []
        per_lr = {lr: [runs[lr]["trained"][d][m] for d in datasets] for lr in lrs}
        with_nan = _any_nan(c for cells in per_lr.values() for c in cells)
        for lr in lrs:
            res = runs[lr]
            cells = per_lr[lr] + [res.get("average", {}).get("trained", {}).get(m)]
            rows.append([f"{lr:g}", *(_ci_cell(c, "auroc") for c in cells)]
                        + ([_nan_cell(per_lr[lr])] if with_nan else []))
            rows_csv += [[lr, m, d, c["auroc"], *(c.get("auroc_ci") or (None, None))]
                         for d, c in zip([*datasets, AVG], cells) if c]
        header = ["Learning rate", *(DATASET_NAMES.get(d, d) for d in datasets), "Avg."] + \
            (["n (NaN)"] if with_nan else [])
        parts.append(f"AUROC, {method_name(m)}:\n\n" + markdown(header, rows))
        hi, lo = lrs[-1], lrs[0]
        ea, eb = _examples_of(runs[hi]), _examples_of(runs[lo])
        if len(lrs) > 1 and _same_examples(ea, eb):
            comp = _paired_models(ea, eb, m, n_bootstrap, seed)
            parts.append(f"lr {hi:g} vs {lo:g}, {method_name(m)} (paired bootstrap, same examples):\n\n"
                         + _comparison_lines(comp, f"lr {hi:g}", f"lr {lo:g}"))
        elif len(lrs) > 1:
            parts.append(f"lr {hi:g} vs {lo:g}: no comparison stated (per-example scores of both runs on the same "
                         "examples are needed).\n")
    text = "\n".join(parts)
    return text, {"table4.md": text, "table4.csv": csv_text(
        ["lr", "method", "dataset", "auroc", "auroc_ci_lo", "auroc_ci_hi"], rows_csv)}


def write_table4(out: Path, runs: dict[float, dict], methods: list[str]) -> str:
    """:func:`table4` written into ``out``; returns the markdown."""
    text, outputs = table4(runs, methods)
    files.write_all(out, outputs)
    return text


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
    outputs: dict[str, str | bytes] = {f"{name}.csv": csv_text(
        ["contamination_pct", "total_tokens", "background_tokens", "dataset", "auroc_trained", "auroc_trained_ci_lo",
         "auroc_trained_ci_hi", "auroc_base"], rows)}
    with_nan = _any_nan(res["trained"][d][m] for _, _, _, res in points for d in datasets)
    header = ["Corpus tokens", "Contamination %", *(DATASET_NAMES.get(d, d) for d in datasets)] + \
        (["n (NaN)"] if with_nan else [])
    md = [[str(man["tokens"]["total"]), f"{rate:.2f}", *(_ci_cell(res["trained"][d][m], "auroc") for d in datasets)]
          + ([_nan_cell([res["trained"][d][m] for d in datasets])] if with_nan else [])
          for rate, _, man, res in points]
    text = f"# {title}\n\n{rebuild_line()}{method_name(m)} AUROC [95% CI]:\n\n" + markdown(header, md)
    (hi_rate, _, _, hi), (lo_rate, _, _, lo) = points[-1], points[0]
    if len(points) > 1 and _same_examples(_examples_of(hi), _examples_of(lo)):
        comp = _paired_models(_examples_of(hi), _examples_of(lo), m, *_bootstrap_cfg(hi))
        text += (f"\nHighest ({hi_rate:.2f}%) vs lowest ({lo_rate:.2f}%) contamination rate, {method_name(m)}, "
                 "paired bootstrap on the same examples:\n\n"
                 + _comparison_lines(comp, f"{hi_rate:.2f}%", f"{lo_rate:.2f}%"))
    outputs[f"{name}.md"] = text
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for d in datasets:
        ax.plot([p[0] for p in points], [_num(p[3]["trained"][d][m]["auroc"]) for p in points], "o-",
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
    outputs: dict[str, str | bytes] = {"fig5c.csv": csv_text(
        ["dataset", "occurrences", "n_members", *(f"{m}{s}" for m in shown for s in ("", "_ci_lo", "_ci_hi"))],
        [[g, k, n, *(v for m in shown for v in (r[m]["auroc"], *(r[m]["auroc_ci"] or (None, None))))]
         for g, k, n, r in rows])}
    with_nan = _any_nan(r[m] for _, _, _, r in rows for m in shown)
    header = ["Dataset", "Occurrences", "Members", *(method_name(m) for m in shown)] + \
        ([f"n (NaN) {method_name(m)}" for m in shown] if with_nan else [])
    md = [[DATASET_NAMES.get(g, g), str(k), str(n), *(_ci_cell(r[m], "auroc") for m in shown)]
          + ([_nan_cell([r[m]]) for m in shown] if with_nan else []) for g, k, n, r in rows]
    text = (f"# Figure 5c: AUROC [95% CI] of the members inserted k times against all non-members\n\n"
            "'All' pools the datasets after rank-normalising each dataset's scores.\n\n"
            f"{rebuild_line()}" + markdown(header, md))
    lines = []
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
                                             n_bootstrap=n_bootstrap, seed=seed)
                said = metrics.describe(c, f"k={ks[-1]}", "k=1")
            except ValueError as e:
                said = f"k={ks[-1]} vs k=1: {_na(str(e).replace('n/a: ', ''))}"
            lines.append(f"- {DATASET_NAMES.get(g, g)}, {method_name(m)}: {said}\n")
    if lines:
        text += "\nLargest k vs k = 1 (bootstrap of the difference, the same non-members):\n\n" + "".join(lines)
    outputs["fig5c.md"] = text
    fig, ax = pyplot().subplots(figsize=(5.5, 4))
    for g in dict.fromkeys(r[0] for r in rows):
        pts = [(k, _num(r[shown[0]]["auroc"])) for gg, k, n, r in rows if gg == g]
        ax.plot(*zip(*pts), "o-", lw=2.5 if g == "all" else 1.2, label=DATASET_NAMES.get(g, g))
    ax.set_xlabel("occurrences of the example in the corpus")
    ax.set_ylabel(f"AUROC ({method_name(shown[0])})")
    ax.set_title("Figure 5c: detection vs occurrence frequency", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    outputs["fig5c.png"] = figure_bytes(fig)
    return outputs


def load_metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


# ----------------------------------------------------------------------------- python -m train.tables --from DIR


SWEEPS = {"lr_": "lr", "size_": "size", "news_": "news", "occurrence": "occurrence"}
_NEITHER = ("neither a run folder ({run} and {ex}) nor a sweep folder (sub-folders lr_*, size_*, news_* or occurrence "
            "holding them)").format(run=RUN, ex=EXAMPLES)


def _sweep_kind(name: str) -> str | None:
    return next((k for prefix, k in SWEEPS.items() if name.startswith(prefix)), None)


def source_runs(folder: Path, flag: str = "--from") -> tuple[str | None, list[str]]:
    """(sweep kind or None for one run, [sub-folder names, "" for the run itself]) of a ``--from`` folder, after
    checking every file a rebuild reads against the folder's manifest.json (``rundir.verify``: the files the run
    wrote, unchanged). A sweep's runs are those its manifest records and those on disk: one missing or added is an
    error."""
    folder = Path(folder)
    if (folder / EXAMPLES).exists() or (folder / RUN).exists():
        rundir.verify(folder, list(RUN_FILES), flag)
        return None, [""]
    on_disk = {p.name for p in folder.iterdir() if p.is_dir() and ((p / EXAMPLES).exists() or (p / RUN).exists())}
    if not on_disk and not (folder / rundir.MANIFEST).is_file():
        raise UserError(f"{flag} {folder}: {_NEITHER}")
    entries = rundir.verify(folder, [], flag)
    recorded = {n.split("/", 1)[0] for n in entries if "/" in n and n.split("/", 1)[1] in RUN_FILES}
    subs = sorted(on_disk | recorded)
    kinds = {_sweep_kind(s) for s in subs}
    if not subs or len(kinds) != 1 or None in kinds:
        raise UserError(f"{flag} {folder}: {_NEITHER}; found {', '.join(subs) or 'no run'}")
    rundir.verify(folder, [f"{s}/{f}" for s in subs for f in RUN_FILES], flag)
    for s in subs:  # and each run's own record (the same files: a damaged one is refused, not passed over)
        rundir.verify(folder / s, list(RUN_FILES), flag)
    return kinds.pop(), subs


def _get(obj, path: str, kind, where: str):
    """``obj[a][b]...`` for the dotted ``path``, checked to be of ``kind``; UserError naming ``where`` otherwise."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise UserError(f"{where} lacks {path} (not the run.json of a contamination run)")
        obj = obj[part]
    if not isinstance(obj, kind) or isinstance(obj, bool):
        raise UserError(f"{where}: {path} is {obj!r:.60}, not the {getattr(kind, '__name__', 'value')} a run writes")
    return obj


_NUMBER = (int, float)


def _check_row(row, where: str) -> None:
    if not isinstance(row, dict):
        raise UserError(f"{where}: not a JSON object")
    for key in ("dataset", "label", "text_sha256", "trained", "base"):
        if key not in row:
            raise UserError(f"{where}: no {key!r} field (a record of {EXAMPLES} has dataset, label, text_sha256, "
                            "blind, trained, base)")
    if not isinstance(row["dataset"], str) or row["label"] not in (0, 1) or isinstance(row["label"], bool):
        raise UserError(f"{where}: dataset must be a string and label 0 or 1, got {row['dataset']!r:.40}, "
                        f"{row['label']!r:.20}")
    for model in ("trained", "base"):
        scores = row[model]
        if not isinstance(scores, dict) or not all(
                v is None or (isinstance(v, _NUMBER) and not isinstance(v, bool)) for v in scores.values()):
            raise UserError(f"{where}: {model!r} must map each method to a number or null")
    b = row.get("blind")
    if not (b is None or (isinstance(b, _NUMBER) and not isinstance(b, bool))):
        raise UserError(f"{where}: 'blind' must be a number or null, got {b!r:.40}")
    if "occurrences" in row and (not isinstance(row["occurrences"], int) or isinstance(row["occurrences"], bool)):
        raise UserError(f"{where}: 'occurrences' must be a whole number, got {row['occurrences']!r:.20}")


def load_run(folder: Path, kind: str | None = None) -> dict:
    """A run's ``run.json`` with its example rows under ``examples``, every field the tables read checked (a
    ``UserError`` names the file, and the line of examples.jsonl.gz). Call after :func:`source_runs` (verified)."""
    folder = Path(folder)
    path = folder / RUN
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(info, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(info).__name__}")
    methods = _get(info, "methods", list, str(path))
    if not methods or not all(isinstance(m, str) for m in methods):
        raise UserError(f"{path}: methods must be a non-empty list of method names")
    _get(info, "config.score.n_bootstrap", int, str(path))
    _get(info, "config.score.seed", int, str(path))
    _get(info, "config.corpus", dict, str(path))
    _get(info, "config.model.path", str, str(path))
    if kind == "lr":
        _get(info, "config.train.lr", _NUMBER, str(path))
    if kind in ("size", "news"):
        _get(info, "corpus.contamination_rate", _NUMBER, str(path))
        _get(info, "corpus.tokens.total", int, str(path))
        _get(info, "corpus.tokens.background", int, str(path))
    ex = folder / EXAMPLES
    rows = []
    for n, row in files.read_jsonl(ex):
        _check_row(row, f"{ex} line {n}")
        rows.append(row)
    if not rows:
        raise UserError(f"{ex} holds no example")
    for d, idx in _by_dataset(rows).items():
        n_members = sum(rows[i]["label"] for i in idx)
        if n_members in (0, len(idx)):
            raise UserError(f"{ex}: dataset {d} has one class only ({n_members} members, {len(idx) - n_members} "
                            "non-members): not the eval set of a contamination run")
    if info["config"]["corpus"].get("occurrence") in ("poisson", "buckets") or kind == "occurrence":
        missing = next((i for i, r in enumerate(rows) if "occurrences" not in r), None)
        if missing is not None:
            raise UserError(f"{ex}: record {missing + 1} has no 'occurrences' (needed for Figure 5c)")
    return dict(info, examples=rows)


def load_source(folder: Path, flag: str = "--from") -> tuple[str | None, list[tuple[str, dict]]]:
    """(sweep kind or None, [(sub-folder name, :func:`load_run`)]) of a ``--from`` folder, verified and checked."""
    kind, subs = source_runs(folder, flag)
    return kind, [(s, load_run(Path(folder) / s if s else Path(folder), kind)) for s in subs]


def rebuild_outputs(folder: Path, loaded=None) -> tuple[str, dict[str, str | bytes]]:
    """(the main table's markdown, {path relative to the output folder: content}) of every table and figure of a
    run or sweep folder; nothing is written. ``loaded``: :func:`load_source` of ``folder`` when already read."""
    kind, runs = loaded if loaded is not None else load_source(folder)
    if kind is None:
        _, outputs = run_outputs(runs[0][1]["examples"], runs[0][1])
        return outputs["table3.md"], outputs
    outputs: dict[str, str | bytes] = {}
    res = []
    for name, info in runs:
        results, outs = run_outputs(info["examples"], info)
        outputs.update({f"{name}/{k}": v for k, v in outs.items()})
        res.append(dict(results, examples=info["examples"], corpus=info.get("corpus"), config=info["config"]))
    methods = runs[0][1]["methods"]
    if kind == "lr":
        text, outs = table4({r["config"]["train"]["lr"]: r for r in res}, methods)
    elif kind in ("size", "news"):
        name, title = (("fig5a", "Figure 5a: outlier contaminants (downstream examples) vs corpus size")
                       if kind == "size" else
                       ("fig5b", "Figure 5b: in-distribution contaminants (2023 news) vs corpus size"))
        outs = size_figure(name, [(r["corpus"], r) for r in res], methods, title)
        text = outs[f"{name}.md"]
    else:
        outs = occurrence_figure(*_records_and_eval(res[0]["examples"]), methods)
        text = outs["fig5c.md"]
    outputs.update(outs)
    return text, outputs


def rebuild(folder: Path, out: Path | None = None) -> str:
    """A run folder (holding examples.jsonl.gz) or a sweep folder (sub-folders lr_*, size_*, news_*, occurrence):
    every table and figure rebuilt from the per-example scores into ``out`` (default: in place). Every input is
    checked and every output computed before any is written (all or none: ``files.write_all``)."""
    folder = Path(folder)
    text, outputs = rebuild_outputs(folder)
    out = Path(out) if out is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    files.write_all(out, outputs)
    return text


def build_parser() -> entry.ArgumentParser:
    p = entry.ArgumentParser(prog=PROG, description="Rebuild every table and figure of a contamination run or sweep "
                             "from its per-example scores (no model needed).")
    p.add_argument("--from", dest="src", required=True, metavar="DIR",
                   type=entry.source_dir("contamination", example="results/contamination/lr"),
                   help="a run folder (run.json + examples.jsonl.gz) or a sweep folder of such runs")
    p.add_argument("--out", type=entry.out_dir, metavar="DIR",
                   help="write there instead of in place (the same layout): a new or empty folder, or this "
                        "command's own earlier rebuild of the same --from")
    return p


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    out = args.out if args.out is not None else args.src
    text, outputs = rebuild_outputs(args.src)  # every input checked, every output computed: nothing written yet
    with rundir.rebuild_into(out, [args.src], "train.tables"):
        files.write_all(out, outputs)
    print(text)
    return 0


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv, resume_hint="run the same command again (a rebuild writes all its files or "
                     "none)")


if __name__ == "__main__":
    sys.exit(main())

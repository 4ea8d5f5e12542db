"""The cells and names of the contamination tables and figures (train/run_tables.py, train/sweep_tables.py): method
and dataset names, ``value [lo, hi]`` cells and n/a with its reason (their CSV and PNG bytes: ``report.csv_bytes``,
``report.figure_bytes``)."""
from __future__ import annotations

import numpy as np

from mia_jax.evaluation.report import with_ci
from train.records import EXAMPLES

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
    """The line under each table's title: how it is rebuilt (``what``: the --from folder shown)."""
    return (f"Rebuilt from the per-example scores ({EXAMPLES}) by `python -m train.tables --from {what}`; "
            "intervals: 95% stratified bootstrap; comparisons: paired bootstrap on the same examples.\n\n")


def method_name(method: str) -> str:
    """A method's display name: ``min_k@0.2`` -> ``Min-K% Prob (k=20%)``."""
    base, _, k = method.partition("@")
    name = BASE_NAMES.get(base, base)
    return f"{name} (k={float(k):.0%})" if k else name


def headline(methods, base: str = "min_k") -> str | None:
    """The first of ``methods`` whose base name is ``base`` (any k); None when there is none."""
    return next((m for m in methods if m.partition("@")[0] == base), None)


def reason(r: dict | None) -> str | None:
    """Why a cell is n/a (a class with fewer than metrics.MIN_PER_CLASS examples, one class left, ...), from its
    ``note``; None when it has no note."""
    return r["note"].replace("n/a: ", "") if r and r.get("note") else None


def na(why: str | None) -> str:
    """``n/a (why)``, or ``n/a`` without a reason."""
    return f"n/a ({why})" if why else "n/a"


def ci_cell(r: dict | None, key: str) -> str:
    """``value [lo, hi]``; n/a with the reason (``note``) when the metric could not be computed."""
    if r is None:
        return "n/a"
    if r.get(key) is None:
        return na(reason(r))
    return with_ci(r.get(key), r.get(f"{key}_ci"))


def nan_cell(cells: list) -> str:
    """``n (NaN)`` over a row's cells (metrics.evaluate dicts): scored examples and NaN/inf scores excluded."""
    cells = [c for c in cells if c and "n_scored" in c]
    return f"{sum(c['n_scored'] for c in cells)} ({sum(c.get('n_nan') or 0 for c in cells)})"


def any_nan(cells) -> bool:
    """Whether any of the cells (metrics.evaluate dicts or None) excluded NaN/inf scores."""
    return any(c and (c.get("n_nan") or 0) > 0 for c in cells)


def num(v) -> float:
    """``v``, with None as NaN (a point a plot leaves out)."""
    return np.nan if v is None else v

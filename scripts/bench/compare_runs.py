"""How far two runs of the same texts disagree: per method, the largest score difference and the AUROC of each with
the paired bootstrap interval of their difference (e.g. ``--dtype bfloat16`` against float32, or this version of the
toolkit against an earlier one)::

    python scripts/bench/compare_runs.py runs/wikimia-32-smollm2 runs/wikimia-32-smollm2-bf16

Each argument is a run folder (its ``results.jsonl``) or a results file. The texts must be the same, in the same
order, with labels (a labeled ``mia-jax eval``). "relative" is |A - B| / max(1, |A|), the largest over the texts
that both runs scored; "texts over 1e-5" counts the texts above that relative difference; "NaN/inf" counts each run's
texts without a finite score (excluded). A method with fewer than 10 scored members or non-members is n/a with
the reason.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mia_jax.runs import entry, files
from mia_jax.errors import UserError
from mia_jax.evaluation.comparisons import paired_bootstrap
from mia_jax.evaluation.metrics import scores_by_method

PROG = "python scripts/bench/compare_runs.py"


def run_or_results(text: str) -> Path:
    """argparse type of A and B: a run folder holding ``results.jsonl``, or a results file."""
    path = Path(text)
    if path.is_dir():
        if not (path / "results.jsonl").is_file():
            raise argparse.ArgumentTypeError(f"{text}: no results.jsonl there (give a finished run folder)")
        return entry.input_file(str(path / "results.jsonl"))
    return entry.input_file(text)


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("a", type=run_or_results, help="run folder or results.jsonl")
    ap.add_argument("b", type=run_or_results, help="run folder or results.jsonl of the same texts")
    ap.add_argument("--n-bootstrap", type=entry.positive_int, default=2000)
    ap.add_argument("--seed", type=entry.nonneg_int, default=0)
    return ap


def read(path: Path) -> list[dict]:
    records = []
    for n, rec in files.read_jsonl(path):
        if not isinstance(rec, dict) or "index" not in rec or not isinstance(rec.get("scores"), dict):
            raise UserError(f"{path} line {n}: not a record of a run (index and scores)")
        records.append(rec)
    if not records:
        raise UserError(f"{path} holds no record")
    return records


def main(argv=None) -> int:
    """Exit 2 with one line on a bad argument or file, as the mia-jax commands do."""
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    ra, rb = read(args.a), read(args.b)
    if [r["index"] for r in ra] != [r["index"] for r in rb] or any(r.get("label") != s.get("label")
                                                                    for r, s in zip(ra, rb)):
        raise UserError("the two runs do not hold the same texts and labels")
    if any(r.get("label") not in (0, 1) for r in ra):
        raise UserError(f"{args.a}: every text needs a label 0 or 1 (a labeled mia-jax eval)")
    methods = [m for m in ra[0]["scores"] if m in rb[0]["scores"]]
    if not methods:
        raise UserError("the two runs share no method")
    labels = np.array([r["label"] for r in ra])
    sa, sb = scores_by_method(ra, methods), scores_by_method(rb, methods)
    print(f"A = {args.a}\nB = {args.b}\n{len(ra)} texts; paired bootstrap of AUROC(A) - AUROC(B), "
          f"{args.n_bootstrap} resamples\n")
    print("| method | largest relative difference | texts over 1e-5 | NaN/inf A, B | AUROC A | AUROC B "
          "| A - B [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in methods:
        both = np.isfinite(sa[m]) & np.isfinite(sb[m])
        rel = np.abs(sa[m] - sb[m])[both] / np.maximum(1.0, np.abs(sa[m][both]))
        largest = f"{rel.max():.2e}" if rel.size else "n/a"
        nan = f"{int((~np.isfinite(sa[m])).sum())}, {int((~np.isfinite(sb[m])).sum())}"
        try:
            p = paired_bootstrap(labels, sa[m], sb[m], n_bootstrap=args.n_bootstrap, seed=args.seed)["auroc"]
        except ValueError as e:  # too few scored examples of a class: no comparison, the reason instead
            print(f"| {m} | {largest} | {int(np.sum(rel > 1e-5))} | {nan} | n/a | n/a | n/a ({e}) |")
            continue
        print(f"| {m} | {largest} | {int(np.sum(rel > 1e-5))} | {nan} | {p['a']:.4f} | {p['b']:.4f} | "
              f"{p['diff']:+.4f} [{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

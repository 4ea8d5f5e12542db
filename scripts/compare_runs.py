"""How far two runs of the same texts disagree: per method, the largest score difference and the AUROC of each with
the paired bootstrap interval of their difference (e.g. ``--dtype bfloat16`` against float32, or this version of the
toolkit against an earlier one)::

    python scripts/compare_runs.py runs/wikimia-32-smollm2 runs/wikimia-32-smollm2-bf16

Each argument is a run folder (its ``results.jsonl``) or a results file. The texts must be the same, in the same
order, with labels (a labeled ``mia-jax eval``). "relative" is |A - B| / max(1, |A|), the largest over the texts
that both runs scored; "texts over 1e-5" counts the texts above that relative difference.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from mia_jax.errors import UserError
from mia_jax.metrics import paired_bootstrap, scores_by_method


def read(path: str) -> list[dict]:
    p = Path(path)
    p = p / "results.jsonl" if p.is_dir() else p
    if not p.is_file():
        raise UserError(f"{path}: no results.jsonl there")
    try:
        return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: not a results file ({e})") from None


def main() -> int:
    """Exit 2 with one line on a bad argument or file, as the mia-jax commands do."""
    try:
        compare()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def compare() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--n-bootstrap", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ra, rb = read(args.a), read(args.b)
    if [r["index"] for r in ra] != [r["index"] for r in rb] or any(r.get("label") != s.get("label")
                                                                    for r, s in zip(ra, rb)):
        raise UserError("the two runs do not hold the same texts and labels")
    methods = [m for m in ra[0]["scores"] if m in rb[0]["scores"]]
    labels = np.array([r["label"] for r in ra])
    sa, sb = scores_by_method(ra, methods), scores_by_method(rb, methods)
    print(f"A = {args.a}\nB = {args.b}\n{len(ra)} texts; paired bootstrap of AUROC(A) - AUROC(B), "
          f"{args.n_bootstrap} resamples\n")
    print("| method | largest relative difference | texts over 1e-5 | AUROC A | AUROC B | A - B [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in methods:
        both = np.isfinite(sa[m]) & np.isfinite(sb[m])
        rel = np.abs(sa[m] - sb[m])[both] / np.maximum(1.0, np.abs(sa[m][both]))
        p = paired_bootstrap(labels, sa[m], sb[m], n_bootstrap=args.n_bootstrap, seed=args.seed)["auroc"]
        print(f"| {m} | {rel.max():.2e} | {int(np.sum(rel > 1e-5))} | {p['a']:.4f} | {p['b']:.4f} | "
              f"{p['diff']:+.4f} [{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}] |")


if __name__ == "__main__":
    sys.exit(main())

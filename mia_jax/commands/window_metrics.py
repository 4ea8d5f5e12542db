"""``mia-jax window-metrics``: window-level AUROC of a finished ``eval --window`` run, per dataset; the metrics
themselves: :func:`mia_jax.audits.concat.window_metrics`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mia_jax.runs import entry
from mia_jax.audits.concat import check_out_file, window_metrics, window_metrics_markdown
from mia_jax.commands.options import RESUME
from mia_jax.runs.files import write_all

NAME = "window-metrics"
HELP = "window-level AUROC of an eval --window run, per dataset"
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax window-metrics`` on ``p``."""
    p.add_argument("run", type=entry.input_dir, help="the eval --window run folder")
    p.add_argument("--data", type=entry.input_file,
                   help="the run's --data file, to group its texts by --by (default: one group)")
    p.add_argument("--by", default="dataset", help="the field of --data that groups the texts (default: dataset)")
    p.add_argument("--method", help="the method that sets the 5%% FPR threshold (default: min_k_pp@ or the first)")
    p.add_argument("--n-bootstrap", type=entry.nonneg_int, default=1000)
    p.add_argument("--seed", type=entry.nonneg_int, default=0)
    p.add_argument("--out", help="also write the reports as JSON to this file (not a folder)")


def run(args) -> None:
    """``mia-jax window-metrics`` with the parsed ``args``: print one table per group and, with --out, write the
    reports as JSON (an --out that is a folder is refused before anything is read)."""
    if args.out:
        check_out_file(args.out)
    reps = window_metrics(args.run, args.data, by=args.by, method=args.method, n_bootstrap=args.n_bootstrap,
                          seed=args.seed)
    print(window_metrics_markdown(reps))
    if args.out:
        out = Path(args.out)
        write_all(out.parent, {out.name: json.dumps(reps, indent=2, default=str) + "\n"})

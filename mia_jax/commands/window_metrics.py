"""``mia-jax window-metrics``: window-level AUROC of a finished ``eval --window`` run, per dataset; the metrics
themselves: :func:`mia_jax.audits.concat.window_metrics`."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mia_jax.runs import entry
from mia_jax.audits.concat import check_out_file, window_metrics, window_metrics_markdown
from mia_jax.commands.options import RESUME
from mia_jax.commands.request import CommandRequest
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


@dataclass(frozen=True)
class WindowMetricsRequest(CommandRequest):
    """``mia-jax window-metrics`` as asked: the ``eval --window`` folder ``run``, its texts grouped by the field
    ``by`` of ``data``, the threshold of ``method``, the bootstrap (``n_bootstrap``, ``seed``) and the JSON ``out``."""
    COMMAND: ClassVar[str] = NAME
    run: Path
    data: Path | None
    by: str
    method: str | None
    n_bootstrap: int
    seed: int
    out: str | None


def run(args: argparse.Namespace) -> None:
    """``mia-jax window-metrics`` with the parsed ``args`` made into its request
    (:meth:`WindowMetricsRequest.from_args`, the only reader of ``args``), then :func:`run_request`."""
    run_request(WindowMetricsRequest.from_args(args))


def run_request(request: WindowMetricsRequest) -> None:
    """``mia-jax window-metrics`` as ``request`` asks: print one table per group and, with --out, write the reports
    as JSON (an --out that is a folder is refused before anything is read)."""
    r = request
    if r.out:
        check_out_file(r.out)
    reps = window_metrics(r.run, r.data, by=r.by, method=r.method, n_bootstrap=r.n_bootstrap, seed=r.seed)
    print(window_metrics_markdown(reps))
    if r.out:
        out = Path(r.out)
        write_all(out.parent, {out.name: json.dumps(reps, indent=2, default=str) + "\n"})

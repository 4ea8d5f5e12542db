"""``mia-jax eval``: score labeled texts and evaluate the detectors (AUROC, TPR@FPR, ROC plot, the blind baseline
and the paired comparisons); the run itself: :mod:`mia_jax.commands.scoring`."""
from __future__ import annotations

import argparse

from mia_jax.runs import entry
from mia_jax.commands import scoring
from mia_jax.commands.options import RESUME

NAME = "eval"
HELP = "score labeled texts and evaluate the detectors (AUROC, TPR@FPR, ROC plot)"
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax eval`` on ``p``: those of scoring, then the metrics'."""
    scoring.add_arguments(p, labeled=True)
    p.add_argument("--n-bootstrap", type=entry.nonneg_int, default=1000,
                   help="bootstrap resamples for the 95%% CIs")
    p.add_argument("--seed", type=entry.nonneg_int, default=0,
                   help="bootstrap and blind-baseline cross-validation seed")
    p.add_argument("--no-blind", action="store_true",
                   help="skip the model-free bag-of-words baseline that is otherwise reported beside the detectors")
    p.add_argument("--compare", nargs=2, action="append", metavar=("A", "B"), default=[],
                   help="also report the paired bootstrap of method A minus method B on the same texts (AUROC and "
                        "TPR@5%%FPR differences with 95%% CIs and a verdict: 'A > B', 'B > A' or 'not "
                        "distinguishable'); repeatable; a bare min_k etc. names its single --k")


def run(args) -> None:
    """``mia-jax eval`` with the parsed ``args``: score the texts into the run folder and report the metrics."""
    scoring.run(args, labeled=True)

"""``mia-jax score``: score unlabeled texts (no metrics); the run itself: :mod:`mia_jax.commands.scoring`."""
from __future__ import annotations

import argparse

from mia_jax.commands import scoring
from mia_jax.commands.options import RESUME

NAME = "score"
HELP = "score unlabeled texts (no metrics)"
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax score`` on ``p``."""
    scoring.add_arguments(p, labeled=False)


def run(args) -> None:
    """``mia-jax score`` with the parsed ``args``: score the texts into the run folder (results.jsonl, run.json)."""
    scoring.run(args, labeled=False)

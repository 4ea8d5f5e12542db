"""Seeded samples of labeled rows that keep each label's share: what ``--limit`` keeps of labeled data, and what the
blind baseline of a streamed corpus reads."""
from __future__ import annotations

from typing import Sequence

import numpy as np

LIMIT_SEED = 0  # --limit's sample of labeled data (fixed: the sample is part of what a run scores, its fingerprint)


def stratified_sample(labels: Sequence[int], limit: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded sample of at most ``limit`` rows, each label kept in its share of ``labels``
    (largest remainders; every index when there are no more than ``limit``).

    >>> stratified_sample([1, 1, 1, 1, 0, 0, 0, 0], 4).tolist()  # two of each, in file order
    [1, 2, 4, 6]
    """
    y = np.asarray(labels, np.int64)
    if y.size <= limit:
        return np.arange(y.size)
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * limit / y.size
    take = np.floor(exact).astype(int)
    take[np.argsort(take - exact, kind="stable")[: limit - take.sum()]] += 1  # the largest remainders round up
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(y == c), k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked))


def limit_rows(labels: Sequence[int] | None, n: int, limit: int | None) -> np.ndarray | None:
    """The rows ``--limit`` keeps of ``n`` rows: None (all) without a limit or when there are no more than it; the
    first ``limit`` of unlabeled data; of labeled data (``labels``) a seeded sample stratified by label
    (``stratified_sample``, seed ``LIMIT_SEED``), in file order, so that a file sorted by label still gives both."""
    if limit is None or n <= limit:
        return None
    if labels is None:
        return np.arange(limit)
    return stratified_sample(labels, limit, seed=LIMIT_SEED)


def describe_limit(labels: Sequence[int] | None, limit: int | None, n: int) -> str:
    """How ``--limit`` chose its rows, for the run's notes ('' when it kept them all)."""
    if limit is None or n <= limit:
        return ""
    if labels is None:
        return f"--limit {limit}: the first {limit} of {n} texts"
    return (f"--limit {limit}: a seeded sample (seed {LIMIT_SEED}) of {limit} of {n} texts, stratified by label, in "
            "file order")

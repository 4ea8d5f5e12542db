"""Seeded samples of labeled rows: balanced by label, what ``--limit`` keeps of labeled data; each label in its
share, what the blind baseline of a streamed corpus reads."""
from __future__ import annotations

from typing import Sequence

import numpy as np

LIMIT_SEED = 0  # --limit's sample of labeled data (fixed: the sample is part of what a run scores, its fingerprint)


def stratified_sample(labels: Sequence[int], limit: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded sample of at most ``limit`` rows, each label kept in its share of ``labels``
    (largest remainders; every index when there are no more than ``limit``).

    >>> stratified_sample([1, 1, 1, 1, 0, 0, 0, 0], 4).tolist()  # two of each, in file order
    [0, 1, 6, 7]
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


def balanced_sample(labels: Sequence[int], limit: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded sample of at most ``limit`` rows with the labels as even as the data allows: each
    label ``limit / labels`` rows, a label with fewer all of its rows and the others the rest (every index when there
    are no more than ``limit``). AUROC and TPR at a fixed FPR do not depend on the classes' shares, and the smaller
    class bounds their precision: an even sample gives the most precise metrics of ``limit`` texts.

    >>> balanced_sample([1] * 8 + [0] * 2, 6).tolist()  # both non-members and four members
    [0, 1, 2, 6, 8, 9]
    """
    y = np.asarray(labels, np.int64)
    if y.size <= limit:
        return np.arange(y.size)
    classes, counts = np.unique(y, return_counts=True)
    take, left = np.zeros(len(classes), int), limit
    for i, c in enumerate(np.argsort(counts, kind="stable")):  # the smallest first: its leftover goes to the others
        take[c] = min(counts[c], left // (len(classes) - i))
        left -= take[c]
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(y == c), k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked))


def limit_rows(labels: Sequence[int] | None, n: int, limit: int | None) -> np.ndarray | None:
    """The rows ``--limit`` keeps of ``n`` rows: None (all) without a limit or when there are no more than it; the
    first ``limit`` of unlabeled data; of labeled data (``labels``) a seeded sample balanced by label
    (``balanced_sample``, seed ``LIMIT_SEED``), in file order, so that a file sorted by label still gives both."""
    if limit is None or n <= limit:
        return None
    if labels is None:
        return np.arange(limit)
    return balanced_sample(labels, limit, seed=LIMIT_SEED)


def describe_limit(labels: Sequence[int] | None, limit: int | None, n: int) -> str:
    """How ``--limit`` chose its rows, for the run's notes ('' when it kept them all)."""
    if limit is None or n <= limit:
        return ""
    if labels is None:
        return f"--limit {limit}: the first {limit} of {n} texts"
    y = np.asarray(labels)[limit_rows(labels, n, limit)]
    return (f"--limit {limit}: a seeded sample (seed {LIMIT_SEED}) of {limit} of {n} texts, balanced by label "
            f"({int((y == 1).sum())} members, {int((y == 0).sum())} non-members), in file order")

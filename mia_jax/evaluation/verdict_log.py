"""A record of the verdicts a computation draws, for re-testing them under other bootstrap seeds (``python
scripts/build_results.py --seeds N``): while :func:`recording` is active, every Holm family that the comparisons of
one table form (:func:`comparisons.holm_adjust`) is recorded with its comparisons, each of which knows how to
recompute itself with another seed (``comparisons.Comparison.redo``). Nothing is recorded otherwise (the cost is one
check)."""
from __future__ import annotations

import contextlib

_ACTIVE: list[dict] = []
_PAUSED = [0]


@contextlib.contextmanager
def recording():
    """Record inside the block; yields ``{"families": [(key, alpha, [comparisons])]}``."""
    log: dict = {"families": []}
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


@contextlib.contextmanager
def paused():
    """Nothing recorded inside the block (a computation's own re-test of its verdicts under other seeds: ``--seeds``
    re-tests the verdicts it states, not that re-test)."""
    _PAUSED[0] += 1
    try:
        yield
    finally:
        _PAUSED[0] -= 1


def active() -> bool:
    """Whether a :func:`recording` block is open (and not :func:`paused`)."""
    return bool(_ACTIVE) and not _PAUSED[0]


def family(key: str, alpha: float | None, results: list) -> None:
    """One Holm family: its metric ``key``, level and comparisons (:func:`comparisons.holm_adjust`)."""
    if active():
        _ACTIVE[-1]["families"].append((key, alpha, list(results)))

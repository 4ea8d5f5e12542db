"""A record of the verdicts a computation draws, for re-testing them under other bootstrap seeds (``python
scripts/build_results.py --seeds N``): while :func:`recording` is active, every paired comparison made by
:mod:`mia_jax.comparisons` leaves how to recompute it with its seed shifted (:func:`record`), and every Holm family
the comparisons of one table form (:func:`family`). Nothing is recorded otherwise (the cost is one check)."""
from __future__ import annotations

import contextlib
from typing import Callable

_ACTIVE: list[dict] = []


@contextlib.contextmanager
def recording():
    """Record inside the block; yields ``{"recompute": {id(result): (result, fn(offset) -> result)}, "families":
    [(key, alpha, [results])]}``."""
    log: dict = {"recompute": {}, "families": []}
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


def active() -> bool:
    """Whether a :func:`recording` block is open."""
    return bool(_ACTIVE)


def record(result: dict, recompute: Callable[[int], dict]) -> None:
    """``result`` (a comparison) and ``recompute(offset)``: the same comparison with the seed + offset."""
    if _ACTIVE:
        _ACTIVE[-1]["recompute"][id(result)] = (result, recompute)


def family(key: str, alpha: float | None, results: list) -> None:
    """One Holm family: its metric ``key``, level and comparisons (:func:`comparisons.holm_adjust`)."""
    if _ACTIVE:
        _ACTIVE[-1]["families"].append((key, alpha, list(results)))

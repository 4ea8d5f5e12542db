"""The Monte-Carlo resolution of a paired-bootstrap p-value (:func:`mia_jax.evaluation.comparisons.bootstrap_p`): how
far ``p = min(1, 2k / B)`` may lie from the p of infinitely many resamples, how it is printed, and how many resamples a
verdict near its threshold needs.

``k`` (the resamples on the far side of 0) is a binomial count of B draws, so p carries a Monte-Carlo interval: the
Clopper-Pearson interval of ``k / B`` at ``MC_CONFIDENCE`` (99%), doubled (:func:`p_interval`). A verdict whose
(Holm-adjusted) interval lies on one side of its threshold is the one infinitely many resamples would give but for
a chance of about 0.5% per look, under any seed; one whose interval straddles it is resampled more
(:func:`next_resamples`, up to ``MAX_RESAMPLES``) and called "undecided" if it still does
(:func:`mia_jax.evaluation.comparisons.holm_adjust`): it states no verdict, so no other seed's verdict contradicts it. A
p of 0 (no resample crossed) is no measurement but a floor: it prints as ``< 1/(B+1)`` (:func:`p_text`), never 0.000."""
from __future__ import annotations

import math

import numpy as np

from mia_jax.evaluation.rounding import fmt

MC_CONFIDENCE = 0.99  # the level of the Monte-Carlo interval of a bootstrap p
MAX_RESAMPLES = 100_000  # the most resamples a comparison near its threshold is given


def p_interval(p, n_bootstrap, confidence: float = MC_CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) arrays: the Monte-Carlo interval of each bootstrap p ``p = min(1, 2k / B)`` of ``n_bootstrap`` (B)
    resamples: ``2 x`` the Clopper-Pearson interval of ``k / B`` at ``confidence``, capped at 1 (``k`` recovered as
    ``round(p B / 2)``; lo = 0 when k = 0)."""
    from scipy.stats import beta  # here: scipy.stats takes ~0.4 s to import, off the CLI's start-up

    p = np.atleast_1d(np.asarray(p, dtype=np.float64))
    n = np.broadcast_to(np.asarray(n_bootstrap, dtype=np.float64), p.shape)
    k = np.minimum(np.rint(p * n / 2.0), n)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.zeros_like(p), np.ones_like(p)
    some, short = k > 0, k < n
    lo[some] = beta.ppf(tail, k[some], n[some] - k[some] + 1)
    hi[short] = beta.ppf(1.0 - tail, k[short] + 1, n[short] - k[short])
    return np.minimum(1.0, 2.0 * lo), np.minimum(1.0, 2.0 * hi)


def decided(lo, hi, level) -> np.ndarray:
    """Whether each Monte-Carlo interval [lo, hi] of a p-value lies on one side of its ``level`` (a verdict stated
    when p < level: all of it below, or all of it at or above)."""
    lo, hi, level = (np.asarray(x, dtype=np.float64) for x in (lo, hi, level))
    return (hi < level) | (lo >= level)


def next_resamples(p: float, n_bootstrap: int, multiplier: float, level: float) -> int:
    """The resamples to draw next for a comparison whose p (``n_bootstrap`` resamples; ``multiplier``: its Holm
    factor, the adjusted p is about ``multiplier * p``) is undecided at ``level``: the fewest (on a grid of thousands
    growing by a quarter from ``n_bootstrap``) at which the same p would be decided, a fifth more when p > 0 (the
    next p moves), at most ``MAX_RESAMPLES``."""
    grid = np.unique(np.minimum(MAX_RESAMPLES, np.ceil(n_bootstrap * 1.25 ** np.arange(1, 64) / 1000.0) * 1000.0))
    grid = grid[grid > n_bootstrap]
    if not grid.size:
        return MAX_RESAMPLES
    lo, hi = p_interval(np.full(grid.size, p), grid)
    ok = decided(np.minimum(1.0, multiplier * lo), np.minimum(1.0, multiplier * hi), level)
    if not ok.any():
        return MAX_RESAMPLES
    more = grid[int(np.argmax(ok))] * (1.2 if p > 0 else 1.0)
    return int(min(MAX_RESAMPLES, math.ceil(more / 1000.0) * 1000))


def p_text(p: float | None, n_bootstrap: int) -> str:
    """A bootstrap p (raw or Holm-adjusted) of ``n_bootstrap`` resamples as printed: ``fmt(p)``; ``"< 1/(B+1)"``
    with B filled in (``"< 1/2001"``) when it is 0, as no resample crossed 0 (a floor, not a measurement); ``"<
    0.001"`` when it is smaller than 0.001 but not 0; ``"n/a"`` for None / NaN."""
    if p is None or not math.isfinite(p):
        return "n/a"
    if p == 0:
        return f"< 1/{int(n_bootstrap) + 1}"
    return "< 0.001" if p < 0.001 else fmt(p)

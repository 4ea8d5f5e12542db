"""Min-K% Prob (Shi et al. 2023), its mirror Max-K%, Min-K%++ (Zhang et al. 2024) with its two one-factor
calibrations (its Table 3 ablation), and Gap-K% (Kwak and Kim 2026).

The one-factor calibrations follow the Min-K%++ paper's Section 4.3 text ("when log p(x_t|x_<t) and sigma are
included, the token-wise score becomes log p / sigma"): ``min_k_pp_mu`` = log p(x_i) - mu_i, ``min_k_pp_sigma`` =
log p(x_i) / sigma_i; the authors' code (zjysteven/mink-plus-plus, ``run.py``) ships only the full z-score.

Gap-K% follows the authors' code (meaoww/gap-k, ``wikimia.py`` and ``mimir.py``, ``window_lowmean``): gap =
log p(x_i) - log p(top-1), over sigma_i; a moving average over windows of 3 consecutive tokens
(``np.convolve(..., mode="valid")``: n - 2 values); a text with fewer than 3 scored tokens keeps its raw gaps; the
mean of the k-fraction lowest of those values. It differs in the k count (this project's exact ``k_count`` of the
number of values, theirs ``int(len * 0.2)``), in a text without scored tokens (NaN here, 0.0 there) and in the
variance (``stats``' stable one floored at ``stats.VAR_FLOOR``; theirs E[l^2] - E[l]^2 clamped at 1e-8).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from mia_jax.scorers.base import TokenBatch, register


def k_count(k: float, n) -> np.ndarray:
    """max(1, floor(k * n)) without floating-point error: k is taken as the decimal it prints as.

    (The published code's int(n * 0.7) gives 62 for n = 90; this gives 63.)
    """
    frac = Fraction(repr(float(k)))
    n = np.asarray(n, np.int64)
    # Python integers: n * numerator overflows int64 for a k such as 0.1 + 0.2 = 0.30000000000000004
    counts = [max(1, int(v) * frac.numerator // frac.denominator) for v in n.ravel()]
    return np.asarray(counts, np.int64).reshape(n.shape)


def min_k_mean(ascending: np.ndarray, n: np.ndarray, k: float) -> np.ndarray:
    """Mean of the k-fraction lowest values of each row of a row-sorted [B, T] array with n real entries (the
    first n of each row; a real -inf stays -inf)."""
    count = k_count(k, n)
    real = np.arange(ascending.shape[-1]) < np.asarray(n)[:, None]
    csum = np.cumsum(np.where(real, ascending, 0.0), axis=-1)
    idx = np.clip(count - 1, 0, ascending.shape[-1] - 1)
    out = np.take_along_axis(csum, idx[:, None], axis=-1)[:, 0] / count
    return np.where(n > 0, out, np.nan)


@register("min_k", takes_k=True)
def min_k(batch: TokenBatch, k: float) -> np.ndarray:
    """Min-K% Prob: mean log-likelihood of the max(1, floor(k*n)) least likely tokens."""
    return min_k_mean(batch.ascending("logprob"), batch.n, k)


@register("max_k", takes_k=True)
def max_k(batch: TokenBatch, k: float) -> np.ndarray:
    """Max-K% Prob: mean log-likelihood of the max(1, floor(k*n)) most likely tokens."""
    neg_ascending = np.sort(np.where(batch.mask, -batch.stats.logprob, np.inf), axis=-1)
    return -min_k_mean(neg_ascending, batch.n, k)


@register("min_k_pp", takes_k=True)
def min_k_pp(batch: TokenBatch, k: float) -> np.ndarray:
    """Min-K%++: mean of the k-fraction lowest z = (log p(x_i) - mu_i) / sigma_i over the vocabulary."""
    return min_k_mean(batch.ascending("zscore"), batch.n, k)


@register("min_k_pp_mu", takes_k=True)
def min_k_pp_mu(batch: TokenBatch, k: float) -> np.ndarray:
    """Min-K%++ calibrated by the mean only: the k-fraction lowest log p(x_i) - mu_i (Min-K%++ Table 3 ablation)."""
    return min_k_mean(batch.ascending("mu_calibrated"), batch.n, k)


@register("min_k_pp_sigma", takes_k=True)
def min_k_pp_sigma(batch: TokenBatch, k: float) -> np.ndarray:
    """Min-K%++ calibrated by the spread only: the k-fraction lowest log p(x_i) / sigma_i (Table 3 ablation)."""
    return min_k_mean(batch.ascending("sigma_calibrated"), batch.n, k)


def smoothed_gap(gap: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gap-K%'s 3-token moving average over each row's consecutive scored tokens ('valid' windows: position j
    averages j, j+1, j+2 when all three are scored) -> (values [B, T] sorted ascending, +inf past the row's values;
    the number of values per row). A row with 1 or 2 scored tokens keeps its raw values (as the authors' code)."""
    g = np.where(mask, gap, 0.0)
    m = mask.astype(np.int64)
    out = np.full(gap.shape, np.inf)
    if gap.shape[1] >= 3:
        full = (m[:, :-2] + m[:, 1:-1] + m[:, 2:]) == 3
        out[:, :-2] = np.where(full, (g[:, :-2] + g[:, 1:-1] + g[:, 2:]) / 3.0, np.inf)
    short = (m.sum(-1) > 0) & (m.sum(-1) < 3)
    out[short] = np.where(mask[short], gap[short], np.inf)
    return np.sort(out, axis=-1), (out < np.inf).sum(-1)


@register("gap_k", takes_k=True)
def gap_k(batch: TokenBatch, k: float) -> np.ndarray:
    """Gap-K%: mean of the k-fraction lowest 3-token moving averages of (log p(x_i) - max_v log p_v) / sigma_i
    (Kwak and Kim 2026): how far each token falls below the model's top choice, in units of the spread."""
    s = batch.stats
    values, n_windows = smoothed_gap((s.logprob - s.max_logprob) / np.sqrt(s.var), batch.mask)
    return min_k_mean(values, n_windows, k)

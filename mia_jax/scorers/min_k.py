"""Min-K% Prob (Shi et al. 2023), its mirror Max-K%, and Min-K%++ (Zhang et al. 2024)."""
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
    return np.maximum(1, (n * frac.numerator) // frac.denominator)


def min_k_mean(ascending: np.ndarray, n: np.ndarray, k: float) -> np.ndarray:
    """Mean of the k-fraction lowest values of each row of a row-sorted [B, T] array with n real entries."""
    count = k_count(k, n)
    csum = np.cumsum(np.where(np.isfinite(ascending), ascending, 0.0), axis=-1)
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

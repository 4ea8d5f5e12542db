"""Min-K% Prob (Shi et al. 2023), its mirror Max-K%, Min-K%++ (Zhang et al. 2024) with its two one-factor
calibrations (its Table 3 ablation), and Gap-K% (Kwak and Kim 2026).

Every formula here is the mean of the k-fraction lowest of some per-token value (``lowest_k_mean``). The count is
``k_count``: max(1, floor(k n)) in exact integer arithmetic (the published code's ``int(n * 0.7)`` gives 62 for
n = 90; this gives 63), evaluated on the host once per (k, T) for every n = 0..T and selected by the traced n, so it
stays exact under ``jax.jit`` without int32 overflow whatever k is. A real -inf log-prob is the least likely token
(it stays -inf); a row without scored tokens is NaN; the gradient reaches exactly the selected tokens (1/count each).

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
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax import checks
from mia_jax.scorers.base import register
from mia_jax.scorers.reduce import floating, real


def k_count(k: float, n: ArrayLike) -> np.ndarray:
    """max(1, floor(k * n)) without floating-point error: k is taken as the decimal it prints as (host, NumPy).

    Args:
        k: the fraction in (0, 1] (else UserError).
        n: int, any shape: token counts (concrete: read on the host).

    Returns:
        int64 ``np.ndarray`` of ``n``'s shape: the counts.

    >>> int(k_count(0.7, 90))  # int(90 * 0.7) == 62 in the published code
    63
    """
    frac = Fraction(repr(checks.fraction(k)))  # every formula with a fraction counts with this: k checked here
    n = np.asarray(n, np.int64)
    # Python integers: n * numerator overflows int64 for a k such as 0.1 + 0.2 = 0.30000000000000004
    counts = [max(1, int(v) * frac.numerator // frac.denominator) for v in n.ravel()]
    return np.asarray(counts, np.int64).reshape(n.shape)


@lru_cache(maxsize=256)
def _count_table(k: float, length: int) -> np.ndarray:
    return k_count(k, np.arange(length + 1)).astype(np.int32)


def traced_k_count(k: float, n: ArrayLike, length: int) -> jax.Array:
    """``k_count(k, n)`` for a traced integer n in 0..length: the host function tabulated, then selected (a one-hot
    select, not a gather: batch-sharded n indexing a replicated table stays an elementwise op).

    Args:
        k: the fraction in (0, 1] (else UserError).
        n: int [...] token counts in 0..length (may be traced).
        length: the largest count (static).

    Returns:
        int32 [...] the counts.
    """
    table = jnp.asarray(_count_table(checks.fraction(k), int(length)))
    return jnp.where(jnp.asarray(n)[..., None] == jnp.arange(length + 1), table, 0).sum(-1)


def lowest_k_mean(values: ArrayLike, mask: ArrayLike, k: float) -> jax.Array:
    """Mean of the max(1, floor(k n)) lowest ``values`` where ``mask`` ([..., T], n real values per row); NaN where
    n = 0. Sorted with +inf padding; the sum runs over the first ``count`` sorted entries, so the gradient reaches
    exactly the selected values (1 / count each).

    Args:
        values: float, int or bool [..., T] per-token values.
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float (at least float32) [...] each row's mean; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print(lowest_k_mean(jnp.array([[3.0, 1.0, 2.0, 0.0]]), jnp.array([[1, 1, 1, 0]], bool), 0.7))
    [1.5]
    """
    mask = jnp.asarray(mask, bool)
    values = floating(values)
    length = values.shape[-1]
    n = mask.sum(-1)
    ordered = jnp.sort(jnp.where(mask, values, jnp.inf), axis=-1)
    count = traced_k_count(k, n, length)
    slot = jnp.arange(length)
    take = (slot < count[..., None]) & (slot < n[..., None])
    total = jnp.where(take, ordered, 0.0).sum(-1)
    return jnp.where(n > 0, total / count.astype(total.dtype), jnp.nan)


@register("min_k")
def min_k(logprob: ArrayLike, mask: ArrayLike, *, k: float = 0.2) -> jax.Array:
    """Min-K% Prob: mean log-likelihood of the max(1, floor(k*n)) least likely tokens.

    score = (1/m) sum of the m lowest log p(x_i | x_<i), m = max(1, floor(k n)), n the text's scored tokens
    (Shi et al. 2023, *Detecting Pretraining Data from Large Language Models*; swj0419/detect-pretrain-code,
    ``src/run.py``: ``np.sort(all_prob)[:k_length]``, there with ``int(len * ratio)``).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-0.5, -3.0, -1.0, -2.0, -0.25], [-1.0, -4.0, 0.0, 0.0, 0.0]])
    >>> mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    >>> print(min_k(logprob, mask, k=0.4))  # the 2 lowest of 5; 1 of 2
    [-2.5 -4. ]
    """
    return lowest_k_mean(logprob, mask, k)


@register("max_k")
def max_k(logprob: ArrayLike, mask: ArrayLike, *, k: float = 0.2) -> jax.Array:
    """Max-K% Prob: mean log-likelihood of the max(1, floor(k*n)) most likely tokens.

    score = (1/m) sum of the m highest log p(x_i | x_<i), m = max(1, floor(k n)): Min-K%'s mirror (this project's
    control: a member's most likely tokens should be less telling than its least likely ones).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-0.5, -3.0, -1.0, -2.0, -0.25], [-1.0, -4.0, 0.0, 0.0, 0.0]])
    >>> mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    >>> print(max_k(logprob, mask, k=0.4))
    [-0.375 -1.   ]
    """
    return -lowest_k_mean(-floating(logprob), mask, k)


@register("min_k_pp")
def min_k_pp(logprob: ArrayLike, mu: ArrayLike, var: ArrayLike, mask: ArrayLike, *, k: float = 0.2) -> jax.Array:
    """Min-K%++: mean of the k-fraction lowest z = (log p(x_i) - mu_i) / sigma_i over the vocabulary.

    mu_i = E_{v ~ p(.|x_<i)} log p(v | x_<i), sigma_i^2 = Var_{v ~ p(.|x_<i)} log p(v | x_<i) (``stats.token_stats``:
    ``mu`` and ``var``); score = (1/m) sum of the m lowest z_i, m = max(1, floor(k n)) (Zhang et al. 2024,
    *Min-K%++: Improved Baseline for Detecting Pre-Training Data from Large Language Models*, eq. 2-3;
    zjysteven/mink-plus-plus, ``run.py``, there with ``int(len * ratio)``).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mu: float [..., T] E_p[log p] per position (``TokenStats.mu``).
        var: float [..., T] Var_p[log p] per position (``TokenStats.var``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-1.0, -3.0, -2.0]])
    >>> mu, var = jnp.array([[-2.0, -2.0, -1.0]]), jnp.array([[4.0, 1.0, 1.0]])
    >>> print(min_k_pp(logprob, mu, var, jnp.ones((1, 3), bool), k=0.7))  # z = 0.5, -1, -1
    [-1.]
    """
    return lowest_k_mean((real(logprob, mask) - real(mu, mask)) / jnp.sqrt(real(var, mask, 1.0)), mask, k)


@register("min_k_pp_mu")
def min_k_pp_mu(logprob: ArrayLike, mu: ArrayLike, mask: ArrayLike, *, k: float = 0.2) -> jax.Array:
    """Min-K%++ calibrated by the mean only: the k-fraction lowest log p(x_i) - mu_i (Min-K%++ Table 3 ablation).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mu: float [..., T] E_p[log p] per position (``TokenStats.mu``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob, mu = jnp.array([[-1.0, -3.0, -2.0]]), jnp.array([[-2.0, -2.0, -1.0]])
    >>> print(min_k_pp_mu(logprob, mu, jnp.ones((1, 3), bool), k=0.7))  # l - mu = 1, -1, -1
    [-1.]
    """
    return lowest_k_mean(real(logprob, mask) - real(mu, mask), mask, k)


@register("min_k_pp_sigma")
def min_k_pp_sigma(logprob: ArrayLike, var: ArrayLike, mask: ArrayLike, *, k: float = 0.2) -> jax.Array:
    """Min-K%++ calibrated by the spread only: the k-fraction lowest log p(x_i) / sigma_i (Table 3 ablation).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        var: float [..., T] Var_p[log p] per position (``TokenStats.var``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob, var = jnp.array([[-1.0, -3.0, -2.0]]), jnp.array([[4.0, 1.0, 1.0]])
    >>> print(min_k_pp_sigma(logprob, var, jnp.ones((1, 3), bool), k=0.4))  # l / sigma = -0.5, -3, -2
    [-3.]
    """
    return lowest_k_mean(real(logprob, mask) / jnp.sqrt(real(var, mask, 1.0)), mask, k)


def smoothed_gap(gap: ArrayLike, mask: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Gap-K%'s 3-token moving averages over each row's consecutive scored tokens and where they exist ('valid'
    windows: position j averages j, j+1, j+2 when all three are scored); a row with 1 or 2 scored tokens keeps its
    raw values (as the authors' code).

    Args:
        gap: float [..., T] per-token gaps.
        mask: bool [..., T] the scored tokens.

    Returns:
        (float [..., T] the averages, at the window's first position; bool [..., T] where a window exists).
    """
    mask = jnp.asarray(mask, bool)
    g = real(gap, mask)
    m = mask.astype(jnp.int32)
    if g.shape[-1] >= 3:
        full = (m[..., :-2] + m[..., 1:-1] + m[..., 2:]) == 3
        win = (g[..., :-2] + g[..., 1:-1] + g[..., 2:]) / 3.0
        pad = [(0, 0)] * (g.ndim - 1) + [(0, 2)]
        win, full = jnp.pad(win, pad), jnp.pad(full, pad)
    else:
        win, full = jnp.zeros_like(g), jnp.zeros_like(mask)
    n = m.sum(-1)
    short = ((n > 0) & (n < 3))[..., None]
    return jnp.where(short, g, win), jnp.where(short, mask, full)


@register("gap_k")
def gap_k(logprob: ArrayLike, max_logprob: ArrayLike, var: ArrayLike, mask: ArrayLike, *, k: float = 0.2
          ) -> jax.Array:
    """Gap-K%: mean of the k-fraction lowest 3-token moving averages of (log p(x_i) - max_v log p_v) / sigma_i
    (Kwak and Kim 2026): how far each token falls below the model's top choice, in units of the spread.

    g_i = (log p(x_i) - max_v log p(v | x_<i)) / sigma_i; s_j = (g_j + g_{j+1} + g_{j+2}) / 3 for j = 1..n-2
    (n < 3: s = g); score = (1/m) sum of the m lowest s_j, m = max(1, floor(k * len(s))).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        max_logprob: float [..., T] max_v log p(v | x_<i) per position (``TokenStats.max_logprob``).
        var: float [..., T] Var_p[log p] per position (``TokenStats.var``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        k: the fraction in (0, 1] of a row's scored tokens (a Python float: static under ``jax.jit``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-1.0, -4.0, -1.0, -1.0]])
    >>> top, var = jnp.array([[-1.0, -1.0, -1.0, -1.0]]), jnp.ones((1, 4))  # gaps 0, -3, 0, 0
    >>> print(gap_k(logprob, top, var, jnp.ones((1, 4), bool), k=0.5))  # windows -1, -1
    [-1.]
    """
    gap = (real(logprob, mask) - real(max_logprob, mask)) / jnp.sqrt(real(var, mask, 1.0))
    return lowest_k_mean(*smoothed_gap(gap, mask), k)

"""Every single-pass scorer in ``jax.numpy``: ``device_scores(stats, mask, methods)`` inside a researcher's own
``jax.jit`` (methods static), ``jax.vmap``, ``jax.grad`` (the scores are differentiable in the statistics where the
formula is: the lowest-k means pass gradients to the selected tokens) and on sharded arrays.

The formulas mirror the float64 NumPy ones of the registered scorers (``scorers.likelihood``, ``scorers.min_k``,
``scorers.pac``) term for term and are tested equal to them (1e-5 relative in float32, tests/test_device_scores.py):
masked rows, and NaN for a row without tokens. The k count is the host's own ``min_k.k_count`` (one implementation):
evaluated once per (k, T) on the host for every possible n = 0..T, it becomes a constant table the traced n
selects from, so the count is exact integer arithmetic without int32 overflow whatever k is. ``zlib`` needs each text's
compressed length (``zlib_bytes``, from ``scorers.likelihood.zlib_bytes``); methods that need the token ids or a
resource (``dc_pdd``) or a second pass are host-only and refused here. ``FORMS`` lists the methods with a device form.

Padding (``mask`` False) may hold anything, zeros included: its variance is replaced by 1 and its rank by 1 before
any division or log, so a zero-padded statistic never turns into a NaN gradient (0 * inf) of the real tokens.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from mia_jax.scorers.base import MultiPassMethod, parse_method
from mia_jax.scorers.min_k import k_count
from mia_jax.stats import TokenStats


def _count(k: float, n, length: int):
    """``k_count(k, n)`` for a traced n in 0..length: the host function tabulated, then selected (a one-hot select,
    not a gather: batch-sharded n indexing a replicated table stays an elementwise op)."""
    table = jnp.asarray(k_count(k, np.arange(length + 1)), jnp.int32)
    return jnp.where(n[..., None] == jnp.arange(length + 1), table, 0).sum(-1)


def lowest_k_mean(values, valid, k: float):
    """Mean of the max(1, floor(k n)) lowest ``values`` where ``valid`` ([..., T]); NaN where n = 0.

    Sorted with +inf padding; the sum runs over the first ``count`` sorted entries, so the gradient reaches exactly
    the selected tokens (1 / count each)."""
    n = valid.sum(-1)
    ordered = jnp.sort(jnp.where(valid, values, jnp.inf), axis=-1)
    count = _count(k, n, values.shape[-1])
    take = (jnp.arange(values.shape[-1]) < count[..., None]) & (jnp.arange(values.shape[-1]) < n[..., None])
    total = jnp.where(take, ordered, 0.0).sum(-1)
    return jnp.where(n > 0, total / count, jnp.nan)


def _mean(values, mask):
    n = mask.sum(-1)
    return jnp.where(n > 0, jnp.where(mask, values, 0.0).sum(-1) / jnp.maximum(n, 1), jnp.nan)


def _smoothed_gap(gap, mask):
    """Gap-K%'s 3-token moving averages and whether each exists, as ``min_k.smoothed_gap`` ('valid' windows of 3
    consecutive scored tokens; a row with 1 or 2 scored tokens keeps its raw values)."""
    g = jnp.where(mask, gap, 0.0)
    m = mask.astype(jnp.int32)
    n = m.sum(-1)
    if gap.shape[-1] >= 3:
        full = (m[..., :-2] + m[..., 1:-1] + m[..., 2:]) == 3
        win = (g[..., :-2] + g[..., 1:-1] + g[..., 2:]) / 3.0
        pad = [(0, 0)] * (gap.ndim - 1) + [(0, 2)]
        win, full = jnp.pad(win, pad), jnp.pad(full, pad)
    else:
        win, full = jnp.zeros_like(g), jnp.zeros_like(mask)
    short = ((n > 0) & (n < 3))[..., None]
    return jnp.where(short, g, win), jnp.where(short, mask, full)


class _Tokens(NamedTuple):
    """The per-token quantities the formulas read, float32 (or wider) [..., T]; padding made harmless."""

    lp: jnp.ndarray
    mu: jnp.ndarray
    sigma: jnp.ndarray
    entropy: jnp.ndarray
    log_rank: jnp.ndarray
    max_lp: jnp.ndarray
    mask: jnp.ndarray
    zlib_bytes: jnp.ndarray | None


def _polarized(t: _Tokens, k):
    from mia_jax.scorers.pac import FAR, NEAR  # pac imports the passes machinery: import it only when asked

    return lowest_k_mean(t.lp, t.mask, NEAR) + lowest_k_mean(-t.lp, t.mask, FAR)


def _zlib(t: _Tokens, k):
    if t.zlib_bytes is None:
        raise ValueError("'zlib' needs zlib_bytes=: each text's zlib-compressed length in bytes, float [B] "
                         "(scorers.likelihood.zlib_bytes(text))")
    return _mean(t.lp, t.mask) / t.zlib_bytes


# base method name -> f(tokens, k) -> [...]; each mirrors the registered host scorer of the same name
FORMS: dict[str, Callable[[_Tokens, float | None], jnp.ndarray]] = {
    "loss": lambda t, k: _mean(t.lp, t.mask),
    "ppl": lambda t, k: -jnp.exp(-_mean(t.lp, t.mask)),
    "zlib": _zlib,
    "entropy": lambda t, k: -_mean(t.entropy, t.mask),
    "rank": lambda t, k: -_mean(t.log_rank, t.mask),
    "min_k": lambda t, k: lowest_k_mean(t.lp, t.mask, k),
    "max_k": lambda t, k: -lowest_k_mean(-t.lp, t.mask, k),
    "min_k_pp": lambda t, k: lowest_k_mean((t.lp - t.mu) / t.sigma, t.mask, k),
    "min_k_pp_mu": lambda t, k: lowest_k_mean(t.lp - t.mu, t.mask, k),
    "min_k_pp_sigma": lambda t, k: lowest_k_mean(t.lp / t.sigma, t.mask, k),
    "gap_k": lambda t, k: lowest_k_mean(*_smoothed_gap((t.lp - t.max_lp) / t.sigma, t.mask), k),
    "polarized": _polarized,
}


def _camia(name: str):
    def form(t, k):
        from mia_jax.scorers.camia import DEVICE_FORMS  # camia imports the passes machinery: only when asked

        return DEVICE_FORMS[name](t, k)

    return form


FORMS.update({n: _camia(n) for n in ("camia_slope", "camia_count_1", "camia_count_2", "camia_count_3",
                                     "camia_count_pre", "camia_loss_200", "camia_loss_300", "camia_ll_tail")})


def device_scores(stats: TokenStats, mask, methods: Sequence[str], *, zlib_bytes=None) -> dict:
    """{method: float32 [B]} for single-pass ``methods`` (names as the registry's: ``min_k@0.2``) from
    ``TokenStats`` ([B, T] arrays) and a bool ``mask`` [B, T] of the scored tokens (``zlib`` also needs
    ``zlib_bytes`` [B]). Pure ``jax.numpy``: use it under ``jax.jit(..., static_argnames="methods")`` with a tuple
    of names, ``jax.vmap``, ``jax.grad``; the host path ``score_batch`` gives the same numbers in float64."""
    mask = jnp.asarray(mask, bool)
    dtype = jnp.promote_types(jnp.asarray(stats.logprob).dtype, jnp.float32)  # bf16 -> f32; f64 (x64) stays

    def real(x, pad):  # the statistic as dtype, ``pad`` where there is no token
        return jnp.where(mask, jnp.asarray(x).astype(dtype), pad)

    tokens = _Tokens(real(stats.logprob, 0.0), real(stats.mu, 0.0), jnp.sqrt(real(stats.var, 1.0)),
                     real(stats.entropy, 0.0), jnp.log(real(stats.rank, 1.0)), real(stats.max_logprob, 0.0), mask,
                     None if zlib_bytes is None else jnp.asarray(zlib_bytes).astype(dtype))
    out = {}
    for method in methods:
        scorer, k = parse_method(method)
        if isinstance(scorer, MultiPassMethod) or scorer.needs_ids or scorer.resources:
            raise ValueError(f"{method!r} has no device form (it needs a second pass, the token ids or a resource)")
        if scorer.name not in FORMS:
            raise ValueError(f"{method!r} has no device form yet; methods with one: {', '.join(sorted(FORMS))}")
        out[method] = FORMS[scorer.name](tokens, k)
    return out

"""Every single-pass scorer in ``jax.numpy``: ``device_scores(stats, mask, methods)`` inside a researcher's own
``jax.jit`` (methods static), ``jax.vmap``, ``jax.grad`` (the scores are differentiable in the statistics where the
formula is: the lowest-k means pass gradients to the selected tokens) and on sharded arrays.

The formulas mirror the float64 NumPy ones of the registered scorers (``scorers.likelihood``, ``scorers.min_k``)
term for term and are tested equal to them (1e-5 relative in float32): the same exact k count (``k_count``'s
integer rule, ``max(1, floor(k n))`` with k as the decimal it prints as), masked rows, and NaN for a row without
tokens. ``zlib`` needs each text's compressed length (``zlib_bytes``, from ``scorers.likelihood.zlib_bytes``);
methods that need the token ids or a resource (``dc_pdd``) or a second pass are host-only and refused here.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import jax.numpy as jnp

from mia_jax.scorers.base import MultiPassMethod, parse_method
from mia_jax.stats import TokenStats


def _count(k: float, n):
    frac = Fraction(repr(float(k)))
    return jnp.maximum(1, (n * frac.numerator) // frac.denominator)


def lowest_k_mean(values, valid, k: float):
    """Mean of the max(1, floor(k n)) lowest ``values`` where ``valid`` ([..., T]); NaN where n = 0."""
    n = valid.sum(-1)
    ordered = jnp.sort(jnp.where(valid, values, jnp.inf), axis=-1)
    count = _count(k, n)
    take = jnp.arange(values.shape[-1]) < count[..., None]
    total = jnp.where(take & jnp.isfinite(ordered), ordered, 0.0).sum(-1)
    return jnp.where(n > 0, total / jnp.maximum(count, 1), jnp.nan)


def _mean(values, mask):
    n = mask.sum(-1)
    return jnp.where(n > 0, jnp.where(mask, values, 0.0).sum(-1) / jnp.maximum(n, 1), jnp.nan)


def _smoothed_gap(gap, mask):
    """Gap-K%'s 3-token moving averages (+ whether each exists), as ``min_k.smoothed_gap``."""
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
    short = ((n > 0) & (n < 3))[..., None]  # fewer than 3 tokens: the raw values
    return jnp.where(short, g, win), jnp.where(short, mask, full)


def device_scores(stats: TokenStats, mask, methods: Sequence[str], *, zlib_bytes=None) -> dict:
    """{method: float32 [B]} for single-pass ``methods`` (names as the registry's: ``min_k@0.2``) from
    ``TokenStats`` ([B, T] arrays) and a bool ``mask`` [B, T] of the scored tokens. Pure ``jax.numpy``: use it under
    ``jax.jit(..., static_argnames="methods")`` with a tuple of names, ``jax.vmap``, ``jax.grad``."""
    mask = jnp.asarray(mask, bool)
    lp = stats.logprob.astype(jnp.float32)
    sigma = jnp.sqrt(stats.var.astype(jnp.float32))
    out = {}
    for method in methods:
        scorer, k = parse_method(method)
        if isinstance(scorer, MultiPassMethod) or scorer.needs_ids or scorer.resources:
            raise ValueError(f"{method!r} has no device form (it needs a second pass, the token ids or a resource)")
        name = scorer.name
        if name == "loss":
            v = _mean(lp, mask)
        elif name == "ppl":
            v = -jnp.exp(-_mean(lp, mask))
        elif name == "zlib":
            if zlib_bytes is None:
                raise ValueError("'zlib' needs zlib_bytes: each text's zlib-compressed length in bytes "
                                 "(scorers.likelihood.zlib_bytes)")
            v = _mean(lp, mask) / jnp.asarray(zlib_bytes, jnp.float32)
        elif name == "entropy":
            v = -_mean(stats.entropy.astype(jnp.float32), mask)
        elif name == "rank":
            v = -_mean(jnp.log(stats.rank.astype(jnp.float32)), mask)
        elif name == "min_k":
            v = lowest_k_mean(lp, mask, k)
        elif name == "max_k":
            v = -lowest_k_mean(-lp, mask, k)
        elif name == "min_k_pp":
            v = lowest_k_mean((lp - stats.mu) / sigma, mask, k)
        elif name == "min_k_pp_mu":
            v = lowest_k_mean(lp - stats.mu, mask, k)
        elif name == "min_k_pp_sigma":
            v = lowest_k_mean(lp / sigma, mask, k)
        elif name == "polarized":  # PAC's single-pass part: mean of the 30% lowest minus mean of the 5% highest
            from mia_jax.scorers.pac import FAR, NEAR

            v = lowest_k_mean(lp, mask, NEAR) + lowest_k_mean(-lp, mask, FAR)
        elif name == "gap_k":
            v = lowest_k_mean(*_smoothed_gap((lp - stats.max_logprob) / sigma, mask), k)
        else:
            raise ValueError(f"{method!r} has no device form yet")
        out[method] = v
    return out

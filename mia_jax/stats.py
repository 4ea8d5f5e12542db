"""Fused per-token statistics over the vocabulary: the hot kernel.

For every position with logits ``x`` (over the vocabulary) and a target token ``y`` this computes,
in float32:

- ``logprob``     log p(y) = x_y - logsumexp(x)
- ``mu``          E_p[log p] = sum_v p_v log p_v            (the Min-K%++ mean)
- ``var``         Var_p[log p] = Var_p[x], floored at ``VAR_FLOOR`` (the Min-K%++ sigma^2)
- ``entropy``     -sum_v p_v log p_v = -mu
- ``rank``        1 + #{v != y : x_v > x_y}               (1 = the most likely token)
- ``max_logprob`` max_v log p_v

The vocabulary is scanned in chunks with an online (running max) accumulator that merges a
chunk's (max, total weight, weighted mean, weighted sum of squared deviations) into the running
one (Chan et al.'s parallel variance update, weighted by exp(x - max)). Nothing of the form
E[x^2] - E[x]^2 is ever formed, so logits of +-1e4 or a single huge logit give no cancellation,
no NaN and no inf. Vocabulary rows with id >= ``vocab_size`` (padding, e.g. Pythia's 50304 rows
for a 50277-token tokenizer) and logits equal to -inf get zero probability.

``token_stats`` takes logits ``[..., V]``; ``token_stats_from_hidden`` takes hidden states
``[..., D]`` and an unembedding matrix ``[V, D]`` and never forms the full ``[..., V]`` logits:
each chunk's logits are a ``[..., C]`` matmul that lives only inside the scan.
Both are jit-able; ``vocab_size`` and ``chunk_size`` are static.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

VAR_FLOOR = 1e-12
DEFAULT_CHUNK = 8192


class TokenStats(NamedTuple):
    """Per-token statistics, each float32 ``[...]`` (``rank`` int32) with the targets' shape."""

    logprob: jax.Array
    mu: jax.Array
    var: jax.Array
    entropy: jax.Array
    rank: jax.Array
    max_logprob: jax.Array


class _Acc(NamedTuple):
    m: jax.Array  # running max over valid entries (-inf while empty)
    w: jax.Array  # sum of exp(x - m)
    d: jax.Array  # weighted mean of (x - m): small numbers, so no cancellation against m
    m2: jax.Array  # weighted sum of squared deviations from the mean
    above: jax.Array  # count of entries with x > target logit (target itself excluded)


def _chunk_acc(x, ids, valid, target_logit, targets):
    """Accumulator of one chunk. x: [..., C] float32, ids: [C] vocabulary ids, valid: [..., C]."""
    m = jnp.max(jnp.where(valid, x, -jnp.inf), axis=-1)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    xs = jnp.where(valid, x - m_safe[..., None], 0.0)  # x - m, exact near the max (Sterbenz)
    e = jnp.where(valid, jnp.exp(xs), 0.0)  # invalid entries get weight 0
    w = jnp.sum(e, axis=-1)
    d = jnp.sum(e * xs, axis=-1) / jnp.where(w > 0, w, 1.0)
    m2 = jnp.sum(e * jnp.square(xs - d[..., None]), axis=-1)
    above = jnp.sum(valid & (x > target_logit[..., None]) & (ids != targets[..., None]), axis=-1)
    return _Acc(m, w, d, m2, above.astype(jnp.int32))


def _merge(a: _Acc, b: _Acc) -> _Acc:
    m = jnp.maximum(a.m, b.m)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    # an empty accumulator (w == 0, m == -inf) sits at the new max with zero weight
    ma = jnp.where(a.w > 0, a.m, m)
    mb = jnp.where(b.w > 0, b.m, m)
    sa, sb = jnp.exp(ma - m), jnp.exp(mb - m)
    wa, wb = a.w * sa, b.w * sb
    w = wa + wb
    w_safe = jnp.where(w > 0, w, 1.0)
    da, db = a.d + (ma - m), b.d + (mb - m)  # means relative to the new max
    delta = db - da
    d = da + delta * (wb / w_safe)
    m2 = a.m2 * sa + b.m2 * sb + jnp.square(delta) * (wa * wb / w_safe)
    return _Acc(jnp.maximum(a.m, b.m), w, d, m2, a.above + b.above)


def _finish(acc: _Acc, target_logit) -> TokenStats:
    log_w = jnp.log(acc.w)
    mu = acc.d - log_w
    return TokenStats(
        logprob=(target_logit - acc.m) - log_w,
        mu=mu,
        var=jnp.maximum(acc.m2 / acc.w, VAR_FLOOR),
        entropy=-mu,
        rank=acc.above + 1,
        max_logprob=-log_w,
    )


def _scan_vocab(chunk_logits, n_vocab_rows, vocab_size, chunk_size, target_logit, targets):
    """Run the online accumulator over ``chunk_logits(start) -> [..., C]`` for C-wide chunks.

    The last chunk is clamped to end at ``n_vocab_rows`` (no padding copy of the input); ids that
    an earlier chunk already covered are masked out.
    """
    c = min(chunk_size, n_vocab_rows)
    n_chunks = -(-n_vocab_rows // c)
    limit = n_vocab_rows if vocab_size is None else min(vocab_size, n_vocab_rows)

    def chunk(i):
        nominal = i * c
        start = jnp.minimum(nominal, n_vocab_rows - c)
        x = chunk_logits(start, c).astype(jnp.float32)
        ids = start + jnp.arange(c)
        valid = (ids >= nominal) & (ids < limit) & (x > -jnp.inf)
        return _chunk_acc(x, ids, valid, target_logit, targets)

    acc = chunk(0)
    if n_chunks > 1:
        acc = jax.lax.fori_loop(1, n_chunks, lambda i, a: _merge(a, chunk(i)), acc)
    return _finish(acc, target_logit)


@partial(jax.jit, static_argnames=("vocab_size", "chunk_size"))
def token_stats(logits, targets, *, vocab_size: int | None = None, chunk_size: int = DEFAULT_CHUNK) -> TokenStats:
    """Statistics from logits ``[..., V]`` (any float dtype) for integer ``targets`` ``[...]``.

    ``logits[..., t, :]`` must be the prediction for ``targets[..., t]`` (shift before calling:
    ``token_stats(logits[:, :-1], ids[:, 1:])``). ``vocab_size``: the real vocabulary size; rows
    at or beyond it are padding and get zero probability.
    """
    targets = targets.astype(jnp.int32)
    n_rows = logits.shape[-1]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0].astype(jnp.float32)

    def chunk_logits(start, c):
        return jax.lax.dynamic_slice_in_dim(logits, start, c, axis=-1)

    return _scan_vocab(chunk_logits, n_rows, vocab_size, chunk_size, target_logit, targets)


@partial(jax.jit, static_argnames=("vocab_size", "chunk_size"))
def token_stats_from_hidden(
    hidden, unembedding, targets, *, bias=None, vocab_size: int | None = None, chunk_size: int = DEFAULT_CHUNK
) -> TokenStats:
    """Statistics from hidden states ``[..., D]`` and the unembedding (LM head) matrix ``[V, D]``.

    Logits are ``hidden @ unembedding.T (+ bias)``, computed one ``[..., chunk_size]`` slice at a
    time with float32 accumulation; the full ``[..., V]`` logits are never formed.
    """
    targets = targets.astype(jnp.int32)
    n_rows = unembedding.shape[0]
    h = hidden.astype(jnp.float32)

    def logits_of(rows, b):
        x = jnp.einsum("...d,vd->...v", h, rows.astype(jnp.float32), preferred_element_type=jnp.float32)
        return x if b is None else x + b.astype(jnp.float32)

    target_rows = jnp.take(unembedding, targets, axis=0)
    target_logit = jnp.sum(h * target_rows.astype(jnp.float32), axis=-1)
    if bias is not None:
        target_logit = target_logit + jnp.take(bias, targets).astype(jnp.float32)

    def chunk_logits(start, c):
        rows = jax.lax.dynamic_slice_in_dim(unembedding, start, c, axis=0)
        b = None if bias is None else jax.lax.dynamic_slice_in_dim(bias, start, c, axis=0)
        return logits_of(rows, b)

    return _scan_vocab(chunk_logits, n_rows, vocab_size, chunk_size, target_logit, targets)

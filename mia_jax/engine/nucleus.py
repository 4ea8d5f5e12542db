"""The sampling filters of `mia_jax.engine.generate`: a draw from temperature-scaled logits restricted to the top-k
and the top-p nucleus, the filters' threshold found without sorting the vocabulary, and drawn among the row's
largest logits when the kept tokens are all there."""
from __future__ import annotations

import jax
import jax.numpy as jnp

CANDIDATES = 2048  # the largest logits of a row the filters and the draw look at first (lax.top_k)
FALLBACK_ROWS = (16, 64)  # the rows whose kept tokens are not all candidates are gathered into the first of these
#                           sizes that holds them all (more than the last: redone over the whole batch)


def sample_logits(logits, keys, *, temperature=1.0, top_k=None, top_p=None, candidates=CANDIDATES):
    """Token ids [B] from float32 logits [B, V], row b drawn with its PRNG key ``keys[b]`` from
    softmax(logits / temperature) restricted to the top_k largest logits and to the smallest set of most likely
    tokens whose probability reaches top_p (the most likely token is always kept; logits of -inf are never drawn).
    top_k / top_p may be traced; None leaves that filter out. Greedy decoding is `argmax`, not this function.

    The filters keep every logit at or above one threshold per row (:func:`filter_threshold`, no sort). It is
    found first among the row's ``candidates`` largest logits (``lax.top_k``; the top-p normaliser over the whole
    row), and the token drawn among them (``jax.random.categorical`` over the kept candidates), when every kept
    token is a candidate: top_k <= candidates, and the threshold above the smallest candidate (so its mass reaches
    top_p and no token outside ties with it). The other rows are searched and drawn over their whole vocabulary
    (gathered into one of :data:`FALLBACK_ROWS`' sizes, else over the batch, each row keeping its own path), so
    a row's token depends on its logits and key alone, never on its batch.
    The same distribution either way; a row's draw from the candidates uses other random numbers than a draw over
    its whole vocabulary (this project sampled that way before: the samples of a seed changed, their law did not).
    Measured on a 2-core CPU beside another job, on 160 rows of Gemma-3-270M logits (262,144 ids) taken from a
    top-p 0.95 sampling run (15 of the rows keep more than 2,048 tokens): 0.52 s a step, against 3.0 s for the
    search and draw over every whole row (the draw's Gumbel noise about half of that); top-k 50 alone: 0.24 s
    against 3.0 s. ``scripts/bench/benchmark_sampling.py`` times the whole sampling loop both ways."""
    logits = logits.astype(jnp.float32) / temperature
    if top_k is None and top_p is None:
        return draw_whole_rows(logits, keys)
    n = min(candidates, logits.shape[-1])
    # the barrier keeps XLA's TopK: with the slices below read from its output, a CPU compilation rewrote it as a
    # sort of the whole vocabulary (9 s for 160 rows of 262,144 ids, against 0.2 s)
    cand, where = jax.lax.optimization_barrier(jax.lax.top_k(logits, n))
    ck = order_keys(cand)
    z = None
    if top_p is not None and top_k is None:  # the nucleus' normaliser: the whole row's (the max: cand[:, 0])
        z = jnp.sum(jnp.exp(logits - cand[..., :1]), axis=-1)
    t = filter_threshold(cand, ck, None if top_k is None else jnp.minimum(top_k, n), top_p, z=z)
    ok = t > ck[..., -1]
    if top_k is not None:
        ok &= top_k <= n
    pick = _draw(keys, jnp.where(ck >= t[..., None], cand, jnp.finfo(jnp.float32).min))
    tokens = jnp.take_along_axis(where, pick[..., None], axis=-1)[..., 0].astype(jnp.int32)
    return _whole_rows(logits, keys, tokens, ~ok, top_k, top_p)


def _draw(keys, logits):
    """One categorical draw per row of ``logits`` [B, n] with its own key (``keys`` [B])."""
    return jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, logits).astype(jnp.int32)


def draw_whole_rows(logits, keys, top_k=None, top_p=None):
    """Token ids [B] from float32 logits [B, V] (already divided by the temperature), row b drawn with ``keys[b]``
    after the filters' threshold is searched over its whole row: what :func:`sample_logits` does for the rows whose
    kept tokens are not all candidates (and what it did for every row before it looked at candidates)."""
    if top_k is not None or top_p is not None:
        order = order_keys(logits)
        kept = order >= filter_threshold(logits, order, top_k, top_p)[..., None]
        logits = jnp.where(kept, logits, jnp.finfo(jnp.float32).min)
    return _draw(keys, logits)


def _whole_rows(logits, keys, tokens, redo, top_k, top_p):
    """``tokens`` [B] with the rows ``redo`` [B] filtered and drawn over their whole vocabulary: gathered into the
    smallest of FALLBACK_ROWS' sizes that holds them, else every row of the batch (the others keep their token);
    nothing when no row needs it."""
    def redraw(rows):
        if rows is None:
            return jnp.where(redo, draw_whole_rows(logits, keys, top_k, top_p), tokens)
        drawn = draw_whole_rows(logits[rows], keys[rows], top_k, top_p)
        return tokens.at[rows].set(jnp.where(redo[rows], drawn, tokens[rows]))

    count = jnp.sum(redo)
    sizes = [s for s in FALLBACK_ROWS if s < logits.shape[0]]
    order = jnp.argsort(~redo, stable=True)  # the rows to redo first
    branches = [lambda: tokens] + [lambda s=s: redraw(order[:s]) for s in sizes] + [lambda: redraw(None)]
    which = jnp.where(count == 0, 0, 1 + sum((count > s).astype(jnp.int32) for s in sizes))
    return jax.lax.switch(which, branches)


def order_keys(x):
    """uint32 keys of float32 ``x`` in the floats' order (-inf lowest; -0.0 just below +0.0): a float's bits with
    the sign bit set for x >= +0, all bits flipped for x < 0."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _largest_key(holds, shape):
    """Per row, the largest uint32 t with ``holds(t)`` ([...] bool, t [..., 1]; true at t = 0 and non-increasing
    in t), built bit by bit from the top."""
    def step(i, t):
        cand = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        return jnp.where(holds(cand[..., None]), cand, t)

    return jax.lax.fori_loop(0, 32, step, jnp.zeros(shape, jnp.uint32))


def filter_threshold(logits, keys, top_k=None, top_p=None, z=None):
    """Per row [...], the key (:func:`order_keys`) of the smallest logit that top_k and top_p keep: the k-th largest
    logit x_k (ties at it kept), then, of the probabilities renormalised over the k largest, the smallest logit x
    whose more likely tokens (logits above x) hold less than top_p of the mass. The threshold that sorting the row
    gives (the k-th sorted logit; the smallest sorted logit whose cumulative mass before it is below top_p), but
    for the float32 rounding of the masses (sums here, a cumulative sum there). ``z`` [...]: the top-p normaliser
    sum(exp(x - max)) when ``logits`` are part of a row (without top_k); None: over ``logits``. 32 counting passes
    per filter."""
    shape = logits.shape[:-1]
    t = jnp.zeros(shape, jnp.uint32)
    if top_k is not None:
        k = jnp.minimum(top_k, logits.shape[-1])
        t = _largest_key(lambda c: jnp.sum(keys >= c, axis=-1) >= k, shape)
    if top_p is not None:
        e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
        if top_k is not None:  # the k largest: those above x_k, and as many of the logits tied at x_k as make k
            above = keys > t[..., None]
            at = jnp.max(jnp.where(keys == t[..., None], e, 0.0), axis=-1)
            z = jnp.sum(jnp.where(above, e, 0.0), axis=-1) + (k - jnp.sum(above, axis=-1)) * at
        elif z is None:
            z = jnp.sum(e, axis=-1)
        probs = e / z[..., None]
        t = jnp.maximum(t, _largest_key(lambda c: jnp.sum(jnp.where(keys >= c, probs, 0.0), axis=-1) >= top_p,
                                        shape))
    return t

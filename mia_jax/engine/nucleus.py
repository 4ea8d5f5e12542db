"""The sampling filters of `mia_jax.engine.generate`: a draw from temperature-scaled logits restricted to the top-k
and the top-p nucleus, the filters' threshold found without sorting the vocabulary."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_logits(logits, key, *, temperature=1.0, top_k=None, top_p=None):
    """Token ids [B] from float32 logits [B, V], drawn from softmax(logits / temperature) restricted to the top_k
    largest logits and to the smallest set of most likely tokens whose probability reaches top_p (the most
    likely token is always kept; logits of -inf are never drawn). top_k / top_p may be traced; None leaves that
    filter out. Greedy decoding is `argmax`, not this function.

    The filters keep every logit at or above one threshold per row, found without sorting the vocabulary
    (:func:`filter_threshold`: 32 counting passes per filter; a sort of a 49k or 262k vocabulary per row and step
    was most of a sampling step's time on a CPU). The draw itself is ``jax.random.categorical`` over the kept
    logits."""
    logits = logits.astype(jnp.float32) / temperature
    if top_k is None and top_p is None:
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    keys = order_keys(logits)
    kept = keys >= filter_threshold(logits, keys, top_k, top_p)[..., None]
    return jax.random.categorical(key, jnp.where(kept, logits, jnp.finfo(jnp.float32).min), axis=-1).astype(jnp.int32)


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


def filter_threshold(logits, keys, top_k=None, top_p=None):
    """Per row [...], the key (:func:`order_keys`) of the smallest logit that top_k and top_p keep: the k-th largest
    logit x_k (ties at it kept), then, of the probabilities renormalised over the k largest, the smallest logit x
    whose more likely tokens (logits above x) hold less than top_p of the mass. The threshold that sorting the row
    gives (the k-th sorted logit; the smallest sorted logit whose cumulative mass before it is below top_p), but
    for the float32 rounding of the masses (sums here, a cumulative sum there)."""
    shape = logits.shape[:-1]
    t = jnp.zeros(shape, jnp.uint32)
    if top_k is not None:
        k = jnp.minimum(top_k, logits.shape[-1])
        t = _largest_key(lambda c: jnp.sum(keys >= c, axis=-1) >= k, shape)
    if top_p is not None:
        e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
        if top_k is None:
            z = jnp.sum(e, axis=-1)
        else:  # the k largest: those above x_k, and as many of the logits tied at x_k as make k
            above = keys > t[..., None]
            at = jnp.max(jnp.where(keys == t[..., None], e, 0.0), axis=-1)
            z = jnp.sum(jnp.where(above, e, 0.0), axis=-1) + (k - jnp.sum(above, axis=-1)) * at
        probs = e / z[..., None]
        t = jnp.maximum(t, _largest_key(lambda c: jnp.sum(jnp.where(keys >= c, probs, 0.0), axis=-1) >= top_p,
                                        shape))
    return t

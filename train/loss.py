"""The training loss without the [B, T, V] logits: cross-entropy from hidden states and the unembedding, computed in
vocabulary chunks with an online log-sum-exp, forward and backward.

``chunked_cross_entropy(hidden [..., D], unembedding [V_rows, D], targets [...], mask [...])`` -> (sum of the
negative log-likelihoods over the masked-in tokens (float32), their count (int32)). Logits ``hidden @ W.T`` exist
only one ``[N, S, chunk]`` block at a time (N tokens, S vocabulary shards; see below):

- forward: a ``lax.scan`` over chunks keeps the running max ``m``, the running sum ``z`` of exp(x - m) and the
  target's logit; log-sum-exp = m + log z per token. Only the per-token log-sum-exp is saved for the backward pass.
- backward (``jax.custom_vjp``): a second scan recomputes each chunk's logits (vocabulary-major, [S, c, N]),
  p = exp(x - lse), and with dx = g * mask * (p - onehot(target)) adds dx @ W_chunk to dh and emits
  dW_chunk = dx.T @ h. The price of never
  storing logits is one more [N, D] x [D, V] matmul (the forward's, recomputed): four LM-head matmuls instead
  of three.

Rows with id >= ``vocab_size`` (padding of the embedding table, as in ``mia_jax.stats``) get zero probability and
zero gradient. Matmuls take the inputs' dtype (bfloat16 compute stays bfloat16) with float32 accumulation; the
log-sum-exp, probabilities and gradients are float32, the gradients are returned in the inputs' dtypes.

Vocabulary sharding (``shards`` = the mesh's ``model`` axis size, when it divides V_rows): the unembedding is
viewed as [S, V/S, D] and the chunks cut along V/S, so with W's rows sharded over ``model`` each device's chunk is
a slice of its own rows (a chunk cut from [V, D] with a dynamic slice would make GSPMD gather the whole table on
every device). The price: each chunk's logits are [N, S, c] blocks whose max / sum / target reductions cross the
``model`` axis (small all-reduces of [N] vectors per chunk). With S = 1 the chunks are plain row blocks. A chunk
size that does not divide V/S pads the (reshaped) table with zero rows, masked out: one copy of the table per
call, avoided by a dividing chunk size.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 8192


def _layout(n_rows: int, chunk: int, shards: int) -> tuple[int, int, int, int]:
    """(S, rows per shard, chunk width c, number of chunks n) for ``n_rows`` vocabulary rows."""
    s = shards if shards > 1 and n_rows % shards == 0 else 1
    per = n_rows // s
    c = max(1, min(chunk, per))
    return s, per, c, -(-per // c)


def _chunked(w, s: int, per: int, c: int, n: int):
    """[V, D] -> [n, S, c, D]; entry [i, j, k] is row j * per + i * c + k (rows past ``per`` in a shard: zeros)."""
    d = w.shape[-1]
    w = w.reshape(s, per, d)
    if n * c != per:
        w = jnp.pad(w, ((0, 0), (0, n * c - per), (0, 0)))
    return w.reshape(s, n, c, d).transpose(1, 0, 2, 3)


def _unchunked(dw, s: int, per: int, c: int, n: int):
    """The inverse of ``_chunked`` (padding rows dropped): [n, S, c, D] -> [S * per, D]."""
    d = dw.shape[-1]
    return dw.transpose(1, 0, 2, 3).reshape(s, n * c, d)[:, :per].reshape(s * per, d)


def _chunk_ids(i, s: int, per: int, c: int, limit: int):
    """Vocabulary ids [S, c] of chunk ``i`` and which of them are real rows (not shard padding, below ``limit``)."""
    local = i * c + jnp.arange(c)[None, :]
    ids = jnp.arange(s)[:, None] * per + local
    return ids, (local < per) & (ids < limit)


def _logits(h, w):
    return jnp.einsum("nd,scd->nsc", h, w, preferred_element_type=jnp.float32)


def _forward(h, w, targets, limit, chunk, shards):
    s, per, c, n = _layout(w.shape[0], chunk, shards)
    wc = _chunked(w, s, per, c, n)
    tgt = targets[:, None, None]

    def body(carry, xs):
        m, z, tl = carry
        i, wi = xs
        ids, valid = _chunk_ids(i, s, per, c, limit)
        x = jnp.where(valid, _logits(h, wi), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(x, axis=(1, 2)))  # chunk 0 holds row 0, so m_new is finite from there on
        z = z * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new[:, None, None]), axis=(1, 2))
        tl = tl + jnp.sum(jnp.where(ids == tgt, x, 0.0), axis=(1, 2))
        return (m_new, z, tl), None

    tokens = h.shape[0]
    init = (jnp.full((tokens,), -jnp.inf, jnp.float32), jnp.zeros((tokens,), jnp.float32),
            jnp.zeros((tokens,), jnp.float32))
    (m, z, tl), _ = jax.lax.scan(body, init, (jnp.arange(n), wc))
    lse = m + jnp.log(z)
    return lse - tl, lse


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _nll_sum(h, w, targets, weight, limit, chunk, shards):
    nll, _ = _forward(h, w, targets, limit, chunk, shards)
    return jnp.sum(jnp.where(weight > 0, nll * weight, 0.0))


def _nll_sum_fwd(h, w, targets, weight, limit, chunk, shards):
    nll, lse = _forward(h, w, targets, limit, chunk, shards)
    return jnp.sum(jnp.where(weight > 0, nll * weight, 0.0)), (h, w, targets, weight, lse)


def _nll_sum_bwd(limit, chunk, shards, res, g):
    h, w, targets, weight, lse = res
    s, per, c, n = _layout(w.shape[0], chunk, shards)
    wc = _chunked(w, s, per, c, n)
    a = (g * weight).astype(jnp.float32)  # per-token cotangent (0 for masked-out tokens)

    # vocabulary-major [S, c, N] blocks: dW_chunk = dx.T @ h is then a plain matmul; with token-major [N, S, c]
    # blocks XLA:CPU transposed every dx block before it (15% of the loss's time at SmolLM2's sizes)
    def body(dh_t, xs):
        i, wi = xs
        ids, valid = _chunk_ids(i, s, per, c, limit)
        x_t = jnp.einsum("scd,nd->scn", wi, h, preferred_element_type=jnp.float32)
        p = jnp.where(valid[..., None], jnp.exp(x_t - lse), 0.0)
        dx_t = (a * (p - (ids[..., None] == targets))).astype(h.dtype)
        dh_t = dh_t + jnp.einsum("scd,scn->dn", wi, dx_t, preferred_element_type=jnp.float32)
        return dh_t, jnp.einsum("scn,nd->scd", dx_t, h, preferred_element_type=jnp.float32)

    dh_t, dwc = jax.lax.scan(body, jnp.zeros(h.shape[::-1], jnp.float32), (jnp.arange(n), wc))
    return dh_t.T.astype(h.dtype), _unchunked(dwc, s, per, c, n).astype(w.dtype), None, None


_nll_sum.defvjp(_nll_sum_fwd, _nll_sum_bwd)


def chunked_cross_entropy(hidden, unembedding, targets, mask=None, *, vocab_size: int | None = None,
                          chunk_size: int = DEFAULT_CHUNK, shards: int = 1):
    """(sum over masked-in tokens of -log softmax(hidden @ unembedding.T)[target] (float32), their count (int32)).

    hidden [..., D] (any float dtype), unembedding [V_rows, D], targets int [...], mask bool [...] (default: every
    token). ``vocab_size``: the tokenizer's vocabulary; rows at or beyond it are padding (zero probability).
    ``chunk_size``: vocabulary rows per chunk; ``shards``: the vocabulary's shard count on the mesh (see the module
    docstring). Differentiable in hidden and unembedding (the backward pass is chunked too)."""
    d = hidden.shape[-1]
    h = hidden.reshape(-1, d)
    t = targets.reshape(-1).astype(jnp.int32)
    m = jnp.ones(t.shape, bool) if mask is None else mask.reshape(-1).astype(bool)
    rows = unembedding.shape[0]
    limit = rows if vocab_size is None else min(int(vocab_size), rows)
    total = _nll_sum(h, unembedding, t, m.astype(jnp.float32), limit, int(chunk_size), int(shards))
    return total, jnp.sum(m, dtype=jnp.int32)

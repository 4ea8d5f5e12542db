"""Attention for every causal LM family: one entry point, `attention`, three implementations behind it.

q [B, T, H, Dh] attends over k, v [B, S, KV, Dh] (H a multiple of KV: grouped-query heads). What a query sees
is the AND of: `causal` (key slot j <= q_offset + i), `sliding_window` (q_offset + i - j < window: fewer than
`window` slots back), `key_mask` [B, S] (valid keys, e.g. the cache's non-pad slots), an explicit bool `mask`
[T, S] or [B, T, S], and segments: with `segment_ids` [B, T] and `kv_segment_ids` [B, S] (default: `segment_ids`,
when T == S) a query sees only keys of its own segment id (packed rows: several texts in one row). Scores (times
`scale`, then `softcap * tanh(. / softcap)` when set) and softmax are float32; the output has v's dtype. A query
row that sees no key gets the mean of all S values (what a softmax over equal scores gives; the pre-issue-14 code
did the same), never NaN.

Implementations (`implementation=` or $MIA_JAX_ATTENTION, read when the call is traced; argument wins):

- "full": the reference: [B, KV, G, T, S] float32 scores, softmax, weighted sum (memory O(T * S) per head).
- "dot_product": `jax.nn.dot_product_attention`; cuDNN flash attention on a GPU for bf16/fp16, its XLA path
  (the same O(T * S) scores as "full") elsewhere. No softcap. Segments go in as a dense [B, 1, T, S] mask.
- "chunked": flash-attention style: a `lax.map` over query chunks of BLOCK_Q rows, inside it a `lax.scan` over
  key blocks of BLOCK_K slots with a running max and sum (float32), a block no query of the chunk can see is
  skipped (`lax.cond`: causal halves the work; segments skip blocks between texts, their ids sliced per block,
  no [B, T, S] mask). A custom VJP recomputes the block scores in the backward pass from the saved log-sum-exp
  (FlashAttention-2), so forward and gradient memory grow linearly with T and S.
- "auto" (default): "chunked" when T * S >= CHUNKED_MIN_SCORES (on the CPU also for packed rows, segment ids and
  nothing else, of at least CPU_PACKED_MIN slots), else "full" on CPU/TPU; on a GPU, cuDNN
  through "dot_product" when it applies (bf16/fp16, no softcap, and structural masks only, or segments only with
  at most CUDNN_MASK_MAX_SCORES scores per row), with "chunked"/"full" as on CPU otherwise or when cuDNN refuses
  the call. Measured on an H100 (scoring packed rows and the bf16 training step, BENCHMARKS.md); cuDNN's
  backward refuses odd lengths, so those calls are padded by one slot (`_cudnn`).
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mia_jax.errors import UserError

ENV = "MIA_JAX_ATTENTION"
IMPLEMENTATIONS = ("auto", "full", "dot_product", "chunked")
# auto switches to "chunked" from T * S = 512 * 512 (BENCHMARKS.md, "Long texts"). On CPU the chunked path is
# 15% faster at 512 tokens and 2x at 1024 (causal blocks skipped, scores stay in cache), and its memory is linear;
# below 512 the two are within a few per cent, and "full" keeps short texts' results bit for bit what they were.
# Block sizes: 256 x 256 was the fastest on CPU from 512 to 2048 tokens and within noise of the best at 8192.
CHUNKED_MIN_SCORES = 512 * 512
# On a GPU, "auto" gives cuDNN packed rows' segments as a dense [B, 1, T, S] mask up to this many scores per row:
# scoring WikiMIA-32's packed 512-token rows of a 1B Llama on an H100 in bfloat16, the device step took 187.5 ms
# with cuDNN and the mask against 251.8 ms with "chunked" (BENCHMARKS.md). Longer rows, and other masks (key
# masks, explicit masks: not measured on a GPU), stay "chunked" / "full".
CUDNN_MASK_MAX_SCORES = 4096 * 4096
BLOCK_Q = 256
BLOCK_K = 256
# On the CPU, "chunked" runs packed rows (segment ids) one row at a time (`lax.map`) in CPU_PACKED_BLOCK-slot blocks,
# since a block is skipped only when no row of the batch sees it: alone, a row skips every block between its texts.
# With CPU_CHUNK, WikiMIA-32's scoring pass with SmolLM2 (four 512-slot rows a step) on a 2-core CPU took 64.4 s
# against 77.5 s with 256-slot blocks over the batch (BENCHMARKS.md, "The packed engine").
CPU_PACKED_MIN = 256
CPU_PACKED_BLOCK = 32


def implementation_for(t: int, s: int, implementation: str | None = None, *, dtype=jnp.float32,
                       structural_only: bool = True, softcap: float | None = None, segments_only: bool = False) -> str:
    """The implementation `attention` runs for T queries over S keys (resolving "auto" and $MIA_JAX_ATTENTION).
    ``structural_only``: no mask beyond causality and a window; ``segments_only``: segment ids and nothing else
    (packed rows)."""
    name = implementation or os.environ.get(ENV) or "auto"
    if name not in IMPLEMENTATIONS:
        source = "implementation" if implementation else f"${ENV}"
        raise UserError(f"attention: {source}={name!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if name == "dot_product" and softcap is not None:
        raise UserError("attention: the 'dot_product' implementation has no softcap; use 'chunked' or 'full'")
    if name != "auto":
        return name
    if (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and softcap is None
            and (structural_only or (segments_only and t * s <= CUDNN_MASK_MAX_SCORES))):
        return "dot_product"
    packed = segments_only and jax.default_backend() == "cpu" and min(t, s) >= CPU_PACKED_MIN
    return "chunked" if t * s >= CHUNKED_MIN_SCORES or packed else "full"


def dense_mask(t: int, s: int, *, causal: bool = True, sliding_window=None, q_offset=0, key_mask=None, mask=None,
               segment_ids=None, kv_segment_ids=None):
    """The bool mask `attention` applies, materialised: [T, S], or [B, T, S] with a key_mask [B, S], a 3-D mask or
    segment ids ([B, T]; `kv_segment_ids` [B, S] defaults to them)."""
    i = q_offset + jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    out = (j <= i) if causal else jnp.ones((t, s), bool)
    if sliding_window is not None:
        out = out & (i - j < sliding_window)
    if mask is not None:
        out = out & mask.astype(bool)
    if key_mask is not None:
        out = out[None] if out.ndim == 2 else out
        out = out & key_mask[:, None, :].astype(bool)
    if segment_ids is not None:
        kv_segment_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
        out = out & (segment_ids[:, :, None] == kv_segment_ids[:, None, :])
    return out


def attention(q, k, v, *, scale=None, causal: bool = False, sliding_window=None, q_offset=0, key_mask=None,
              mask=None, softcap: float | None = None, implementation: str | None = None,
              block_q: int | None = None, block_k: int | None = None, segment_ids=None, kv_segment_ids=None):
    """q [B, T, H, Dh], k/v [B, S, KV, Dh] -> [B, T, H, Dh] (v's dtype); see the module docstring.

    `scale` defaults to Dh ** -0.5 and may be traced (e.g. a per-layer scale in a scan); `sliding_window` and
    `q_offset` may be Python ints or traced scalars. The gradient is not taken with respect to `scale`.
    `segment_ids` int [B, T], `kv_segment_ids` int [B, S] (default `segment_ids`; needed when T != S): a query
    sees a key only when their segment ids are equal."""
    B, T, H, Dh = q.shape
    S, KV = k.shape[1], k.shape[2]
    if H % KV:
        raise ValueError(f"attention: {H} query heads are not a multiple of {KV} key/value heads")
    if mask is not None and (mask.ndim not in (2, 3) or mask.shape[-2:] != (T, S)):
        raise ValueError(f"attention: mask shape {mask.shape} is not [T, S] or [B, T, S] with T={T}, S={S}")
    segments = _check_segments(B, T, S, segment_ids, kv_segment_ids)
    scale = Dh ** -0.5 if scale is None else scale
    structural = mask is None and key_mask is None and segments is None
    name = implementation_for(T, S, implementation, dtype=q.dtype, structural_only=structural, softcap=softcap,
                              segments_only=mask is None and key_mask is None and segments is not None)
    if name == "dot_product":
        out = _dot_product(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, segments)
        if out is not None:
            return out
        name = "chunked" if T * S >= CHUNKED_MIN_SCORES else "full"
    if name == "full":
        return _full(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, softcap, segments)
    packed = segments is not None and key_mask is None and jax.default_backend() == "cpu"
    bq, bk = block_q or (CPU_PACKED_BLOCK if packed else BLOCK_Q), block_k or (CPU_PACKED_BLOCK if packed else BLOCK_K)
    if not packed or B == 1 or (mask is not None and mask.ndim == 3):
        return _chunked(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, softcap, bq, bk, segments)

    def one_row(a):  # q, k, v, segment ids, kv segment ids of one row
        return _chunked(*(x[None] for x in a[:3]), scale, causal, sliding_window, q_offset, None, mask, softcap, bq,
                        bk, (a[3][None], a[4][None]))[0]

    return jax.lax.map(one_row, (q, k, v) + tuple(segments))


def _check_segments(B, T, S, segment_ids, kv_segment_ids):
    """(query segment ids [B, T], key segment ids [B, S]) or None, checked."""
    if segment_ids is None:
        if kv_segment_ids is not None:
            raise ValueError("attention: kv_segment_ids given without segment_ids")
        return None
    if kv_segment_ids is None:
        if T != S:
            raise ValueError(f"attention: segment_ids alone need T == S (got T={T}, S={S}); pass kv_segment_ids")
        kv_segment_ids = segment_ids
    for name, x, n, dim in (("segment_ids", segment_ids, T, "T"), ("kv_segment_ids", kv_segment_ids, S, "S")):
        if tuple(x.shape) != (B, n) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"attention: {name} must be integers [B, {dim}] = [{B}, {n}], got {x.dtype} "
                             f"{tuple(x.shape)}")
    return segment_ids, kv_segment_ids


# ----------------------------------------------------------------------------- full and dot_product


def _full(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, softcap, segments):
    """The reference: every [T, S] score of every head at once (the code every family used before issue 14)."""
    B, T, H, Dh = q.shape
    S, KV = k.shape[1], k.shape[2]
    q = q.reshape(B, T, KV, H // KV, Dh)  # query heads grouped by their kv head
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    dense = causal or sliding_window is not None or key_mask is not None or segments is not None
    m = dense_mask(T, S, causal=causal, sliding_window=sliding_window, q_offset=q_offset, key_mask=key_mask,
                   mask=mask, **_segment_kwargs(segments)) if dense else mask
    if m is not None:
        scores = jnp.where(m[:, None, None] if m.ndim == 3 else m, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, Dh)


def _segment_kwargs(segments):
    return {} if segments is None else dict(segment_ids=segments[0], kv_segment_ids=segments[1])


def _dot_product(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, segments):
    """`jax.nn.dot_product_attention`: cuDNN on a GPU when it accepts the call (None when it refuses: the caller
    falls back), else its XLA path. Structural masks go in as flags (no [T, S] array) whenever they can."""
    T, S = q.shape[1], k.shape[1]
    static = lambda x: isinstance(x, (int, np.integer))  # noqa: E731
    flags = (static(q_offset) and q_offset == 0 and T == S and mask is None and key_mask is None
             and segments is None and (sliding_window is None or static(sliding_window)))
    kwargs = dict(scale=scale)
    if flags:
        kwargs.update(is_causal=causal,
                      local_window_size=None if sliding_window is None else (int(sliding_window) - 1, 0))
    elif causal or sliding_window is not None or key_mask is not None or mask is not None or segments is not None:
        m = dense_mask(T, S, causal=causal, sliding_window=sliding_window, q_offset=q_offset, key_mask=key_mask,
                       mask=mask, **_segment_kwargs(segments))
        kwargs["mask"] = m[:, None] if m.ndim == 3 else m[None, None]
    cudnn = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
    if cudnn:
        try:
            return _cudnn(q, k, v, kwargs)
        except (NotImplementedError, ValueError, RuntimeError):
            return None
    return jax.nn.dot_product_attention(q, k, v, implementation="xla", **kwargs)


def _cudnn(q, k, v, kwargs):
    """cuDNN attention. Its backward pass refuses an odd query or key length ("Unsupported sequence length", raised
    when a scanned layer is differentiated, past any try here), so such a call is padded to even lengths: the
    extra key is hidden from every real query (by causality when the call is causal, else by the mask), the extra
    query row sees a key and is cut."""
    T, S = q.shape[1], k.shape[1]
    pt, ps = T % 2, S % 2
    if not (pt or ps):
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **kwargs)
    kwargs = dict(kwargs)
    if not kwargs.get("is_causal"):  # (the causal flag comes only with T == S and no mask: see _dot_product)
        m = kwargs["mask"] if "mask" in kwargs else jnp.ones((1, 1, T, S), bool)
        m = jnp.pad(m, ((0, 0), (0, 0), (0, pt), (0, ps)))
        if pt:
            m = m.at[..., T, S if ps else 0].set(True)
        kwargs["mask"] = m
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))  # noqa: E731
    return jax.nn.dot_product_attention(pad(q, pt), pad(k, ps), pad(v, ps), implementation="cudnn",
                                        **kwargs)[:, :T]


# ----------------------------------------------------------------------------- chunked (flash-attention style)


class _Cfg(NamedTuple):
    """Static settings of one chunked call (hashable: a nondiff argument of the custom VJP)."""
    T: int
    S: int
    bq: int
    bk: int
    causal: bool
    softcap: float | None
    has_window: bool
    has_key_mask: bool
    has_mask: bool
    has_segments: bool


def _chunked(q, k, v, scale, causal, sliding_window, q_offset, key_mask, mask, softcap, block_q, block_k, segments):
    B, T, H, Dh = q.shape
    S, KV = k.shape[1], k.shape[2]
    bq, bk = min(block_q, T), min(block_k, S)
    Tp, Sp = -(-T // bq) * bq, -(-S // bk) * bk
    cfg = _Cfg(T, S, bq, bk, bool(causal), None if softcap is None else float(softcap), sliding_window is not None,
               key_mask is not None, mask is not None, segments is not None)
    # heads-major inside: q [B, KV, G, Tp, Dh], k/v [B, KV, Sp, Dh], so every block product is a plain matmul
    qh = jnp.pad(q, ((0, 0), (0, Tp - T), (0, 0), (0, 0))).reshape(B, Tp, KV, H // KV, Dh).transpose(0, 2, 3, 1, 4)
    kh = jnp.pad(k, ((0, 0), (0, Sp - S), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    vh = jnp.pad(v, ((0, 0), (0, Sp - S), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    window = jnp.asarray(0 if sliding_window is None else sliding_window, jnp.int32)
    km = (jnp.zeros((1, Sp), bool) if key_mask is None
          else jnp.pad(key_mask.astype(bool), ((0, 0), (0, Sp - S))))
    m = (jnp.zeros((1, 1, 1), bool) if mask is None
         else jnp.pad((mask if mask.ndim == 3 else mask[None]).astype(bool), ((0, 0), (0, Tp - T), (0, Sp - S))))
    qs, ks = ((jnp.zeros((1, Tp), jnp.int32), jnp.zeros((1, Sp), jnp.int32)) if segments is None else
              (jnp.pad(segments[0], ((0, 0), (0, Tp - T))), jnp.pad(segments[1], ((0, 0), (0, Sp - S)))))
    out, lse = _flash(cfg, qh, kh, vh, jnp.asarray(scale, jnp.float32), jnp.asarray(q_offset, jnp.int32), window,
                      km, m, qs, ks)
    out = out.transpose(0, 3, 1, 2, 4).reshape(B, Tp, H, Dh)[:, :T]
    empty = (lse == -jnp.inf).transpose(0, 3, 1, 2).reshape(B, Tp, H)[:, :T, :, None]
    # rows that see no key: the mean of all values, as a softmax over equal scores gives
    mean_v = jnp.repeat(jnp.mean(v.astype(jnp.float32), axis=1), H // KV, axis=1)[:, None]
    return jnp.where(empty, mean_v, out).astype(v.dtype)


def _block_mask(cfg: _Cfg, qi, kj, q_offset, window, key_mask, mask, q_seg, k_seg):
    """bool [Bm, bq, bk]: which keys of block kj the queries of chunk qi see (Bm is 1 or B)."""
    i = qi * cfg.bq + jnp.arange(cfg.bq)[:, None]
    j = kj * cfg.bk + jnp.arange(cfg.bk)[None, :]
    out = j < cfg.S
    if cfg.causal:
        out = out & (j <= i + q_offset)
    if cfg.has_window:
        out = out & (i + q_offset - j < window)
    out = out[None]
    if cfg.has_key_mask:
        out = out & jax.lax.dynamic_slice_in_dim(key_mask, kj * cfg.bk, cfg.bk, axis=1)[:, None, :]
    if cfg.has_mask:
        out = out & jax.lax.dynamic_slice(mask, (0, qi * cfg.bq, kj * cfg.bk), (mask.shape[0], cfg.bq, cfg.bk))
    if cfg.has_segments:
        out = out & (_rows(q_seg, qi, cfg.bq, 1)[:, :, None] == _rows(k_seg, kj, cfg.bk, 1)[:, None, :])
    return out[:, None, None]  # [Bm, 1, 1, bq, bk], broadcast over kv heads and groups


def _scores(cfg: _Cfg, qb, kb, scale):
    """Block scores [B, KV, G, bq, bk] float32, and tanh(raw / softcap) (for the backward pass) or None."""
    s = jnp.einsum("bkgqd,bksd->bkgqs", qb, kb, preferred_element_type=jnp.float32) * scale
    if cfg.softcap is None:
        return s, None
    t = jnp.tanh(s / cfg.softcap)
    return cfg.softcap * t, t


def _rows(x, i, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def _forward(cfg: _Cfg, q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg):
    """Online softmax: out [B, KV, G, Tp, Dh] float32 (0 for rows that see no key), lse [B, KV, G, Tp]
    (-inf for those rows)."""
    B, KV, G, Tp, Dh = q.shape
    nq, nk = Tp // cfg.bq, k.shape[2] // cfg.bk

    def chunk(qi):
        qb = _rows(q, qi, cfg.bq, 3)

        def body(carry, kj):
            vis = _block_mask(cfg, qi, kj, q_offset, window, key_mask, mask, q_seg, k_seg)

            def step(carry):
                acc, m, total = carry
                s, _ = _scores(cfg, qb, _rows(k, kj, cfg.bk, 2), scale)
                s = jnp.where(vis, s, -jnp.inf)
                m_new = jnp.maximum(m, s.max(-1))
                m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
                p = jnp.exp(s - m_safe[..., None])
                alpha = jnp.exp(m - m_safe)
                pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(v.dtype), _rows(v, kj, cfg.bk, 2),
                                preferred_element_type=jnp.float32)
                return alpha[..., None] * acc + pv, m_new, alpha * total + p.sum(-1)

            return jax.lax.cond(vis.any(), step, lambda c: c, carry), None

        init = (jnp.zeros((B, KV, G, cfg.bq, Dh), jnp.float32), jnp.full((B, KV, G, cfg.bq), -jnp.inf, jnp.float32),
                jnp.zeros((B, KV, G, cfg.bq), jnp.float32))
        (acc, m, total), _ = jax.lax.scan(body, init, jnp.arange(nk))
        total_safe = jnp.where(total == 0, 1.0, total)
        return acc / total_safe[..., None], jnp.where(total == 0, -jnp.inf, m + jnp.log(total_safe))

    out, lse = jax.lax.map(chunk, jnp.arange(nq))  # [nq, B, KV, G, bq, Dh], [nq, B, KV, G, bq]
    return (jnp.moveaxis(out, 0, 3).reshape(B, KV, G, Tp, Dh), jnp.moveaxis(lse, 0, 3).reshape(B, KV, G, Tp))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg):
    return _forward(cfg, q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg)


def _flash_fwd(cfg, q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg):
    out, lse = _forward(cfg, q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg)
    return (out, lse), (q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg, out, lse)


def _flash_bwd(cfg, res, cotangents):
    """FlashAttention-2 backward: per query chunk, per visible key block, recompute p = exp(s - lse); then
    dv += p^T do, ds = p * (do v^T - rowsum(do * out)) (times softcap' and scale), dq += ds k, dk += ds^T q."""
    q, k, v, scale, q_offset, window, key_mask, mask, q_seg, k_seg, out, lse = res
    dout = cotangents[0].astype(jnp.float32)  # lse only feeds a comparison outside: its cotangent is 0
    B, KV, G, Tp, Dh = q.shape
    nq, nk = Tp // cfg.bq, k.shape[2] // cfg.bk
    delta = jnp.sum(dout * out, axis=-1)  # [B, KV, G, Tp]
    lse = jnp.where(lse == -jnp.inf, 0.0, lse)

    def chunk(carry, qi):
        qb, do_i = _rows(q, qi, cfg.bq, 3).astype(jnp.float32), _rows(dout, qi, cfg.bq, 3)
        lse_i, d_i = _rows(lse, qi, cfg.bq, 3), _rows(delta, qi, cfg.bq, 3)

        def body(carry, kj):
            vis = _block_mask(cfg, qi, kj, q_offset, window, key_mask, mask, q_seg, k_seg)

            def step(carry):
                dq_i, dk, dv = carry
                kb, vb = _rows(k, kj, cfg.bk, 2).astype(jnp.float32), _rows(v, kj, cfg.bk, 2).astype(jnp.float32)
                s, t = _scores(cfg, qb, kb, scale)
                p = jnp.where(vis, jnp.exp(s - lse_i[..., None]), 0.0)
                ds = p * (jnp.einsum("bkgqd,bksd->bkgqs", do_i, vb) - d_i[..., None])
                if t is not None:
                    ds = ds * (1.0 - t * t)
                ds = ds * scale
                dq_i = dq_i + jnp.einsum("bkgqs,bksd->bkgqd", ds, kb)
                add = lambda acc, x: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                    acc, _rows(acc, kj, cfg.bk, 2) + x, kj * cfg.bk, axis=2)
                return (dq_i, add(dk, jnp.einsum("bkgqs,bkgqd->bksd", ds, qb)),
                        add(dv, jnp.einsum("bkgqs,bkgqd->bksd", p, do_i)))

            return jax.lax.cond(vis.any(), step, lambda c: c, carry), None

        dk, dv = carry
        (dq_i, dk, dv), _ = jax.lax.scan(body, (jnp.zeros((B, KV, G, cfg.bq, Dh), jnp.float32), dk, dv),
                                         jnp.arange(nk))
        return (dk, dv), dq_i

    zeros = jnp.zeros(k.shape, jnp.float32)
    (dk, dv), dq = jax.lax.scan(chunk, (zeros, zeros), jnp.arange(nq))
    dq = jnp.moveaxis(dq, 0, 3).reshape(q.shape)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)

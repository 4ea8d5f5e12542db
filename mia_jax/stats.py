"""Fused per-token statistics over the vocabulary: the hot kernel.

For every position with logits ``x`` (over the vocabulary) and a target token ``y`` this computes, in float32:

- ``logprob``     log p(y) = x_y - logsumexp(x)
- ``mu``          E_p[log p] = sum_v p_v log p_v            (the Min-K%++ mean)
- ``var``         Var_p[log p] = Var_p[x], floored at ``VAR_FLOOR`` (the Min-K%++ sigma^2)
- ``entropy``     -sum_v p_v log p_v = -mu
- ``rank``        1 + #{v != y : x_v > x_y}               (1 = the most likely token)
- ``max_logprob`` max_v log p_v

The vocabulary is scanned in chunks with an online (running max) accumulator that merges a chunk's (max, total weight,
weighted mean, weighted sum of squared deviations) into the running one (Chan et al.'s parallel variance update,
weighted by exp(x - max)). Nothing of the form E[x^2] - E[x]^2 is ever formed, so logits of +-1e4 or a single huge logit
give no cancellation, no NaN and no inf. Vocabulary rows with id >= ``vocab_size`` (padding, e.g. Pythia's 50304 rows
for a 50277-token tokenizer) and logits equal to -inf get zero probability. NaN propagates: a NaN logit in any real
vocabulary row of a position makes that position's float statistics NaN (``rank``, an integer, stays a count; the
scorers make a text with a NaN statistic NaN, ``scorers.device_scores``), and +inf gives NaN or inf as IEEE says.

With ``temperatures`` (a float array ``[K]``, e.g. ACMIA's, ``scorers.acmia``) the same scan also accumulates, for
each temperature T, the statistics of the scaled distribution p_T = softmax(x / T) (``TemperedStats``: log p_T(y),
E_{p_T}[log p_T], Var_{p_T}[log p_T]), with the same online merge over the chunks of x / T; the temperatures are
data, not constants of the program (one compiled program serves every value of the same K). A temperature that is
not positive and finite gives NaN statistics at that temperature. Without ``temperatures`` nothing of this is traced.

``token_stats`` takes logits ``[..., V]``; ``token_stats_from_hidden`` takes hidden states ``[..., D]`` and an
unembedding matrix ``[V, D]`` and never forms the full ``[..., V]`` logits: each chunk's logits are a ``[..., C]``
matmul that lives only inside the scan. Both are jit-able; ``vocab_size`` and ``chunk_size`` are static.

``token_stats_from_hidden_sharded`` is the same computation with the unembedding sharded over the vocabulary on a mesh
axis (tensor parallelism of the LM head): under ``jax.shard_map`` each shard runs the online accumulator over its own
rows (global ids, so padding rows and the target's rank exclusion are handled exactly), and the shards' accumulators are
combined with ``pmax`` / ``psum`` (rescaled to the global max: the multi-way form of ``_merge``). Nothing larger than a
``[B/data, T, chunk]`` block of logits exists on any device.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
from jax.typing import ArrayLike

from mia_jax import checks
from mia_jax.errors import UserError

VAR_FLOOR = 1e-12
DEFAULT_CHUNK = 8192
# The scoring passes' vocabulary chunk on the CPU: a [tokens, 1024] block of logits stays in cache between the
# chunk's reductions (with the CPU's packed attention, models/attention.py, WikiMIA-32's scoring pass with SmolLM2
# took 64.4 s against 77.5 s: BENCHMARKS.md); accelerators keep DEFAULT_CHUNK, the chunk measured on an H100.
CPU_CHUNK = 1024


def default_chunk() -> int:
    """The scoring passes' default vocabulary chunk on this backend: ``CPU_CHUNK`` on the CPU, else
    ``DEFAULT_CHUNK``.

    Returns:
        The chunk, in vocabulary rows.
    """
    return CPU_CHUNK if jax.default_backend() == "cpu" else DEFAULT_CHUNK


class TokenStats(NamedTuple):
    """Per-token statistics, each float32 ``[...]`` (``rank`` int32) with the targets' shape."""

    logprob: jax.Array
    mu: jax.Array
    var: jax.Array
    entropy: jax.Array
    rank: jax.Array
    max_logprob: jax.Array


class TemperedStats(NamedTuple):
    """Per-token statistics of the scaled distributions p_T = softmax(x / T), one per temperature T of the kernel's
    ``temperatures`` ``[K]``: each float32 ``[..., K]`` (the targets' shape, then the temperatures)."""

    logprob_t: jax.Array  # log p_T(y)
    mu_t: jax.Array  # E_{p_T}[log p_T]
    var_t: jax.Array  # Var_{p_T}[log p_T] = Var_{p_T}[x / T], floored at VAR_FLOOR


class _Acc(NamedTuple):
    m: jax.Array  # running max over valid entries (-inf while empty)
    w: jax.Array  # sum of exp(x - m)
    d: jax.Array  # weighted mean of (x - m): small numbers, so no cancellation against m
    m2: jax.Array  # weighted sum of squared deviations from the mean
    above: jax.Array | None  # count of entries with x > target logit (target itself excluded); None: not counted


def _weights(xs, valid, m) -> _Acc:
    """The (max, weight, mean, M2) accumulator of the entries m + xs where ``valid`` (xs = x - m, 0 elsewhere), over
    the last axis; nothing counted."""
    e = jnp.where(valid, jnp.exp(xs), 0.0)  # invalid entries get weight 0
    w = jnp.sum(e, axis=-1)
    d = jnp.sum(e * xs, axis=-1) / jnp.where(w > 0, w, 1.0)
    m2 = jnp.sum(e * jnp.square(xs - d[..., None]), axis=-1)
    return _Acc(m, w, d, m2, None)


def _chunk_acc(x, ids, in_range, target_logit, targets, betas=None):
    """Accumulator of one chunk. x: [..., C] float32, ids: [C] vocabulary ids, in_range: [C] the chunk's real
    vocabulary rows. A NaN logit among them is kept: its weight exp(NaN) makes the sums NaN, so every statistic of
    that position is NaN (never dropped from the log-sum-exp as a zero-probability -inf logit is). With ``betas``
    [K] (1 / T): also the accumulators of x * beta, one per temperature, over the same entries and sharing the
    chunk's max (m * beta is the max of x * beta for beta > 0): one more exp per entry and temperature."""
    valid = in_range & (x != -jnp.inf)  # -inf entries get weight 0; NaN ones stay (and poison the sums)
    m = jnp.max(jnp.where(valid, x, -jnp.inf), axis=-1)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    xs = jnp.where(valid, x - m_safe[..., None], 0.0)  # x - m, exact near the max (Sterbenz)
    above = jnp.sum(valid & (x > target_logit[..., None]) & (ids != targets[..., None]), axis=-1)
    acc = _weights(xs, valid, m)._replace(above=above.astype(jnp.int32))
    if betas is None:
        return acc
    return acc, tuple(_weights(xs * betas[k], valid, m * betas[k]) for k in range(betas.shape[0]))


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
    return _Acc(jnp.maximum(a.m, b.m), w, d, m2, None if a.above is None else a.above + b.above)


def _log_stats(acc: _Acc, target_logit):
    """(log p(y), E_p[log p], Var_p[log p], entropy, max_v log p_v) of a finished accumulator; NaN where the row holds
    a NaN logit (every float statistic of the position)."""
    log_w = jnp.log(acc.w)
    mu = acc.d - log_w
    nan = jnp.isnan(acc.w) | jnp.isnan(target_logit)

    def poisoned(x):
        return jnp.where(nan, jnp.nan, x)

    return (poisoned((target_logit - acc.m) - log_w), poisoned(mu), poisoned(jnp.maximum(acc.m2 / acc.w, VAR_FLOOR)),
            poisoned(-mu), poisoned(-log_w))


def _finish(acc: _Acc, target_logit) -> TokenStats:
    logprob, mu, var, entropy, max_logprob = _log_stats(acc, target_logit)
    return TokenStats(logprob=logprob, mu=mu, var=var, entropy=entropy,
                      rank=acc.above + 1,  # an integer: the NaN of logprob marks the token (device_scores: NaN text)
                      max_logprob=max_logprob)


def _finish_tempered(accs, target_logit, temperatures) -> TemperedStats:
    """The tempered statistics ``[..., K]`` of the per-temperature accumulators of x / T; NaN at a temperature that
    is not positive and finite."""
    betas = 1.0 / temperatures
    cols = [_log_stats(acc, target_logit * betas[k])[:3] for k, acc in enumerate(accs)]
    bad = ~((temperatures > 0) & jnp.isfinite(temperatures))
    return TemperedStats(*(jnp.where(bad, jnp.nan, jnp.stack([c[i] for c in cols], axis=-1)) for i in range(3)))


def _temperatures(temperatures):
    """``temperatures`` as a float32 ``[K]`` array (None stays None); another shape or dtype: UserError."""
    if temperatures is None:
        return None
    temperatures = jnp.asarray(temperatures, jnp.float32) if isinstance(temperatures, (list, tuple)) else temperatures
    checks.floating("temperatures", temperatures)
    if jnp.ndim(temperatures) != 1 or not jnp.shape(temperatures)[0]:
        raise UserError(f"temperatures must be a 1-D array of at least one temperature, got shape "
                        f"{tuple(jnp.shape(temperatures))}")
    return jnp.asarray(temperatures).astype(jnp.float32)


def _scan_acc(chunk_logits, n_vocab_rows, limit, chunk_size, target_logit, targets, id_offset=0,
              temperatures=None):
    """Run the online accumulator over ``chunk_logits(start, c) -> [..., c]`` for c-wide chunks of ``n_vocab_rows`` rows
    whose global vocabulary ids start at ``id_offset`` (a vocabulary shard's first id; may be traced); ids at or beyond
    ``limit`` are padding. With ``temperatures`` [K]: (the accumulator, the K accumulators of x / T) from the same
    chunks (one per temperature: XLA drops the sums no formula reads).

    The last chunk is clamped to end at ``n_vocab_rows`` (no padding copy of the input); rows that an earlier chunk
    already covered are masked out.
    """
    c = min(chunk_size, n_vocab_rows)
    n_chunks = -(-n_vocab_rows // c)
    betas = None if temperatures is None else 1.0 / temperatures

    def chunk(i):
        nominal = i * c
        start = jnp.minimum(nominal, n_vocab_rows - c)
        x = chunk_logits(start, c).astype(jnp.float32)
        rows = start + jnp.arange(c)
        ids = id_offset + rows
        return _chunk_acc(x, ids, (rows >= nominal) & (ids < limit), target_logit, targets, betas)

    def merge(a, b):
        return _merge(a, b) if betas is None else (_merge(a[0], b[0]), tuple(map(_merge, a[1], b[1])))

    acc = chunk(0)
    if n_chunks > 1:
        acc = jax.lax.fori_loop(1, n_chunks, lambda i, a: merge(a, chunk(i)), acc)
    return acc


def _finish_all(acc, target_logit, temperatures):
    """``TokenStats``, or with ``temperatures`` (``TokenStats``, ``TemperedStats``), of what ``_scan_acc`` made."""
    if temperatures is None:
        return _finish(acc, target_logit)
    return _finish(acc[0], target_logit), _finish_tempered(acc[1], target_logit, temperatures)


def _scan_vocab(chunk_logits, n_vocab_rows, vocab_size, chunk_size, target_logit, targets, temperatures=None):
    limit = n_vocab_rows if vocab_size is None else min(vocab_size, n_vocab_rows)
    acc = _scan_acc(chunk_logits, n_vocab_rows, limit, chunk_size, target_logit, targets, temperatures=temperatures)
    return _finish_all(acc, target_logit, temperatures)


@partial(jax.jit, static_argnames=("vocab_size", "chunk_size"))
def token_stats(logits: ArrayLike, targets: ArrayLike, *, vocab_size: int | None = None,
                chunk_size: int = DEFAULT_CHUNK, temperatures: ArrayLike | None = None
                ) -> TokenStats | tuple[TokenStats, TemperedStats]:
    """Statistics from logits ``[..., V]`` (any float dtype) for integer ``targets`` ``[...]``.

    Checked (``mia_jax.checks``, UserError): floating logits, integer targets of the logits' leading shape; the
    targets' values are not read (this runs under ``jax.jit``): an id outside the vocabulary is the caller's to avoid.

    Args:
        logits: float (any float dtype) [..., V]; ``logits[..., t, :]`` must be the prediction for
            ``targets[..., t]`` (shift before calling: ``token_stats(logits[:, :-1], ids[:, 1:])``).
        targets: int [...] the target token ids.
        vocab_size: the real vocabulary size; rows at or beyond it are padding and get zero probability (static).
        chunk_size: the vocabulary rows per chunk of the scan (static).
        temperatures: float [K] (or a tuple) of temperatures, or None.

    Returns:
        ``TokenStats`` of the targets' shape (float32, ``rank`` int32); with ``temperatures`` (``TokenStats``,
        ``TemperedStats`` float32 ``[..., K]``) from the same pass.
    """
    checks.floating("logits", logits)
    checks.integer("targets", targets)
    checks.shape("targets", targets, logits.shape[:-1])
    targets = targets.astype(jnp.int32)
    n_rows = logits.shape[-1]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0].astype(jnp.float32)

    def chunk_logits(start, c):
        return jax.lax.dynamic_slice_in_dim(logits, start, c, axis=-1)

    return _scan_vocab(chunk_logits, n_rows, vocab_size, chunk_size, target_logit, targets, _temperatures(temperatures))


@partial(jax.jit, static_argnames=("vocab_size", "chunk_size"))
def token_stats_from_hidden(
    hidden: ArrayLike, unembedding: ArrayLike, targets: ArrayLike, *, bias: ArrayLike | None = None,
    vocab_size: int | None = None, chunk_size: int = DEFAULT_CHUNK, temperatures: ArrayLike | None = None,
) -> TokenStats | tuple[TokenStats, TemperedStats]:
    """Statistics from hidden states ``[..., D]`` and the unembedding (LM head) matrix ``[V, D]``.

    Logits are ``hidden @ unembedding.T (+ bias)``, computed one ``[..., chunk_size]`` slice at a time with float32
    accumulation; the full ``[..., V]`` logits are never formed. Checked as ``token_stats``.

    Args:
        hidden: float [..., D] the final hidden states (each position's prediction of ``targets``' token).
        unembedding: float [V, D] the LM head.
        targets: int [...] the target token ids.
        bias: float [V] the LM head's bias, or None.
        vocab_size, chunk_size, temperatures: as ``token_stats``.

    Returns:
        As ``token_stats``.
    """
    _check_hidden(hidden, unembedding, targets)
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

    return _scan_vocab(chunk_logits, n_rows, vocab_size, chunk_size, target_logit, targets, _temperatures(temperatures))


def _check_hidden(hidden, unembedding, targets) -> None:
    """The hidden-state kernels' arguments (``mia_jax.checks``, UserError): floating hidden states and unembedding,
    integer targets of the hidden states' leading shape."""
    checks.floating("hidden", hidden)
    checks.floating("unembedding", unembedding)
    checks.integer("targets", targets)
    checks.shape("targets", targets, hidden.shape[:-1])


def _combine_shards(acc: _Acc, axis) -> _Acc:
    """The accumulators of all shards along mesh ``axis`` merged into one (inside ``shard_map``).

    Each shard's weight, mean offset and M2 are rescaled to the global max (``pmax``) and summed (``psum``): W = sum w_i
    s_i, D = sum w_i s_i d_i / W, M2 = sum (m2_i s_i + w_i s_i (d_i - D)^2), with s_i = exp(m_i - m) and d_i relative to
    the global max, which is ``_merge`` applied to all shards at once."""
    m = jax.lax.pmax(acc.m, axis)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    mi = jnp.where(acc.w > 0, acc.m, m_safe)  # an empty shard sits at the max with zero weight
    s = jnp.exp(mi - m_safe)
    ws = acc.w * s
    di = acc.d + (mi - m_safe)
    w = jax.lax.psum(ws, axis)
    w_safe = jnp.where(w > 0, w, 1.0)
    d = jax.lax.psum(ws * di, axis) / w_safe
    m2 = jax.lax.psum(acc.m2 * s + ws * jnp.square(di - d), axis)
    return _Acc(m, w, d, m2, None if acc.above is None else jax.lax.psum(acc.above, axis))


def token_stats_from_hidden_sharded(
    hidden: ArrayLike, unembedding: ArrayLike, targets: ArrayLike, *, mesh: Mesh, bias: ArrayLike | None = None,
    vocab_size: int | None = None, chunk_size: int = DEFAULT_CHUNK, vocab_axis: str = "model",
    batch_axes: Sequence[str] = ("data", "fsdp"), temperatures: ArrayLike | None = None,
) -> TokenStats | tuple[TokenStats, TemperedStats]:
    """``token_stats_from_hidden`` with the vocabulary sharded over ``vocab_axis`` of ``mesh``.

    Whatever sharding the arguments have, ``shard_map`` re-lays them out to the specs below (e.g. gathers an
    fsdp-sharded D). Call it inside ``jax.jit``, or alone (it is jit-compatible; ``mesh``, ``vocab_size``,
    ``chunk_size`` and the axis names are static). Checked as ``token_stats_from_hidden``.

    Args:
        hidden: float [B, ...rest, D], split over ``batch_axes`` on its first axis (B must be a multiple of their
            total size).
        unembedding: float [V, D], split over ``vocab_axis`` on its first axis (V not a multiple of that axis's size:
            rows zero-padded, and the padding rows masked like any row at or beyond ``vocab_size``).
        targets: int [B, ...rest], split as ``hidden``.
        bias: float [V] or None, split as ``unembedding``.
        mesh, vocab_axis, batch_axes: the device mesh, its axis of the vocabulary shards, its axes of the batch.
        vocab_size, chunk_size, temperatures: as ``token_stats``' (``temperatures`` replicated: each shard's
            tempered accumulators are combined like the others).

    Returns:
        As ``token_stats``, sharded over ``batch_axes``: equal to the unsharded kernel's (to float32 rounding of the
        sums; ``rank`` exactly).
    """
    _check_hidden(hidden, unembedding, targets)
    targets = targets.astype(jnp.int32)
    temperatures = _temperatures(temperatures)
    n_rows = unembedding.shape[0]
    limit = n_rows if vocab_size is None else min(vocab_size, n_rows)
    n_shards = mesh.shape[vocab_axis]
    pad = -n_rows % n_shards
    if pad:
        unembedding = jnp.pad(unembedding, ((0, pad), (0, 0)))
        bias = None if bias is None else jnp.pad(bias, (0, pad))
    batch = tuple(batch_axes) if len(batch_axes) != 1 else batch_axes[0]
    rest = (None,) * (hidden.ndim - 2)
    in_specs = (P(batch, *rest, None), P(vocab_axis, None), P(batch, *rest))
    out_spec = P(batch, *rest)  # a prefix of the whole TokenStats

    def local(h, w, y, extra):
        b, temps = extra.get("bias"), extra.get("temperatures")
        n_local = w.shape[0]
        offset = jax.lax.axis_index(vocab_axis) * n_local
        h = h.astype(jnp.float32)
        # the target's row lives on exactly one shard: the others contribute an exact 0 to the psum
        row = y - offset
        mine = (row >= 0) & (row < n_local)
        row = jnp.clip(row, 0, n_local - 1)
        t_logit = jnp.sum(h * jnp.take(w, row, axis=0).astype(jnp.float32), axis=-1)
        if b is not None:
            t_logit = t_logit + jnp.take(b, row).astype(jnp.float32)
        t_logit = jax.lax.psum(jnp.where(mine, t_logit, 0.0), vocab_axis)

        def chunk_logits(start, c):
            rows = jax.lax.dynamic_slice_in_dim(w, start, c, axis=0)
            x = jnp.einsum("...d,vd->...v", h, rows.astype(jnp.float32), preferred_element_type=jnp.float32)
            return x if b is None else x + jax.lax.dynamic_slice_in_dim(b, start, c, axis=0).astype(jnp.float32)

        acc = _scan_acc(chunk_logits, n_local, limit, chunk_size, t_logit, y, id_offset=offset, temperatures=temps)
        if temps is None:
            acc = _combine_shards(acc, vocab_axis)
        else:
            acc = _combine_shards(acc[0], vocab_axis), tuple(_combine_shards(a, vocab_axis) for a in acc[1])
        return _finish_all(acc, t_logit, temps)

    extra = {k: v for k, v in (("bias", bias), ("temperatures", temperatures)) if v is not None}
    specs = in_specs + ({k: P(vocab_axis) if k == "bias" else P() for k in extra},)
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out_spec)(hidden, unembedding, targets, extra)

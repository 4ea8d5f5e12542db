"""The device step of every scoring pass: packed token ids in, per-text scores out, one jitted program per shape.

``make_score_step(loaded, methods, ...)`` returns ``step(state, batch) -> {"scores": {method: [rows, segments]},
"tokens": TokenStats [rows, segments, length] (only with ``tokens=True``)}``, where ``batch`` is
``batching.packed_arrays(..., targets=True)`` of a ``batching.Step`` (each text's tokens but its last in the row,
``targets`` the token each slot predicts, ``mask`` bool [rows, length] the slots whose prediction is scored: a
prefix's are not), plus ``zlib_bytes`` (float32 [rows, segments]), the methods' resource arrays and, by name, the
``[rows, length]`` arrays of their per-token resources (``scorers.pack_token_resources``: Tag&Tab's keywords).
Inside one ``jax.jit`` (named ``score_step``, so ``compilation.CompileCount("score_step")`` counts its programs):

1. the model's forward over the packed rows (``hidden_states(ids, segment_ids=...)``: positions restart at every
   text, attention never crosses a text boundary), in the parameters' dtype (bfloat16 on accelerators);
2. the float32 statistics of every slot's prediction of its target, vocabulary-chunked
   (``stats.token_stats_from_hidden``; with a mesh, ``token_stats_from_hidden_sharded``: the vocabulary split over
   the model axis); with a method that reads tempered statistics (ACMIA's: ``scorers.temperature_resource``), the
   same scan also makes ``TemperedStats`` at the temperatures of that resource's array in the batch, and only then;
3. each text's statistics gathered out of its row into ``[rows, segments, length]`` (its first prediction at
   column 0, as if the text had been scored alone: the formulas that read positions, e.g. CAMIA's first 200
   tokens or Gap-K%'s consecutive windows, see the same layout);
4. every method's one formula (``scorers.device_scores``) on those, so only ``[rows, segments]`` floats per method
   leave the device, unless a caller asks for the per-token statistics (windowed detection);
5. ``nonfinite`` [rows, segments]: each text's scored tokens whose predictive distribution came out NaN or
   infinite (NaN or +inf logits: a broken checkpoint, an overflow in bfloat16).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from mia_jax.engine import sharding as shd
from mia_jax.batching import real_vocab_size
from mia_jax.scorers import RESOURCES, device_scores, requirements, temperature_resource
from mia_jax.stats import (TemperedStats, TokenStats, default_chunk, token_stats_from_hidden,
                           token_stats_from_hidden_sharded)


def gather_segments(x, starts, spans):
    """[rows, T] per-position values -> [rows, segments, T]: segment s of row r is ``x[r, starts[r, s] + j]``
    for j < ``spans[r, s]`` (zero past it); and the bool ``[rows, segments, T]`` of those j."""
    t = x.shape[-1]
    j = jnp.arange(t)
    valid = j < spans[..., None]
    pos = jnp.clip(starts[..., None] + j, 0, t - 1)
    out = jnp.take_along_axis(x[:, None, :], pos, axis=-1)
    return jnp.where(valid, out, jnp.zeros((), x.dtype)), valid


def gather_tempered(tempered: TemperedStats, starts, spans) -> TemperedStats:
    """``gather_segments`` of each ``[rows, T, K]`` tempered statistic, per temperature: ``[rows, segments, T, K]``."""
    def one(x):
        return gather_segments(x, starts, spans)[0]

    return TemperedStats(*(jax.vmap(one, in_axes=-1, out_axes=-1)(x) for x in tempered))


def make_score_step(loaded, methods: Sequence[str], *, chunk_size: int | None = None, mesh=None,
                    tokens: bool = False):
    """The jitted ``step(state, batch)`` of a scoring pass (see the module docstring); ``methods`` single-pass;
    ``chunk_size``: the statistics' vocabulary chunk (default ``stats.default_chunk()``)."""
    graphdef, chunk_size = nnx.split(loaded.model)[0], chunk_size or default_chunk()
    vocab = real_vocab_size(loaded)
    methods = tuple(methods)
    tempered_by = temperature_resource(methods)  # None: no tempered statistics are computed
    per_token = [r for r in requirements(methods).resources if RESOURCES[r].per_token is not None]

    def score_step(state, batch):
        model = nnx.merge(graphdef, state if mesh is None else shd.gathered_for_lookup(state, mesh))
        starts, spans = batch["starts"], batch["spans"]
        temperatures = None if tempered_by is None else batch["resources"][tempered_by]
        stats = _token_stats(model, batch["ids"], vocab, chunk_size, mesh, batch["segment_ids"], batch["targets"],
                             temperatures)
        stats, tempered = (stats, None) if temperatures is None else stats
        rows, segments = starts.shape
        per_text = TokenStats(*(gather_segments(x, starts, spans)[0] for x in stats))
        targets, _ = gather_segments(batch["targets"], starts, spans)
        mask, _ = gather_segments(batch["mask"], starts, spans)
        flat = lambda x: x.reshape(rows * segments, *x.shape[2:])  # noqa: E731
        if tempered is not None:
            tempered = TemperedStats(*map(flat, gather_tempered(tempered, starts, spans)))
        resources = {**(batch.get("resources") or {}),  # a per-token resource: gathered like the statistics
                     **{r: flat(gather_segments(batch[r], starts, spans)[0]) for r in per_token}}
        scores = device_scores(TokenStats(*map(flat, per_text)), flat(mask), methods, ids=flat(targets),
                               zlib_bytes=flat(batch["zlib_bytes"]), resources=resources, tempered=tempered)
        # NaN or infinite logits leave a NaN or an infinity in the distribution's mean or variance (a real -inf logit
        # is a zero-probability token, finite in both): counted per text, and the runner nulls its every score
        broken = mask & ~(jnp.isfinite(per_text.mu) & jnp.isfinite(per_text.var) & ~jnp.isnan(per_text.logprob))
        out = {"scores": {m: v.reshape(rows, segments) for m, v in scores.items()},
               "nonfinite": broken.sum(-1).astype(jnp.int32)}
        if tokens:
            out["tokens"] = per_text
        if mesh is not None:  # each process reads back only its own rows
            out = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, shd.batch_sharding(mesh, x.ndim)), out)
        return out

    return jax.jit(score_step)


_STEPS: "weakref.WeakKeyDictionary[nnx.Module, dict]" = weakref.WeakKeyDictionary()


def shared_score_step(loaded, methods: Sequence[str], chunk_size: int | None = None, mesh=None,
                      tokens: bool = False):
    """``score_step.make_score_step`` made once per (model, methods, chunk size, mesh, tokens) and reused by every
    pass over the same model, so a step shape compiles once per model, not once per pass."""
    chunk_size = chunk_size or default_chunk()
    key = (tuple(methods), real_vocab_size(loaded), chunk_size, mesh, tokens)
    fns = _STEPS.setdefault(loaded.model, {})
    if key not in fns:
        fns[key] = make_score_step(loaded, methods, chunk_size=chunk_size, mesh=mesh, tokens=tokens)
    return fns[key]


# ----------------------------------------------------------------------------- statistics alone (no scores)


def _token_stats(model, ids, vocab: int, chunk_size: int, mesh=None, segment_ids=None, targets=None,
                 temperatures=None):
    """The forward over ``ids`` [B, T] and the float32 statistics of its predictions: of ``targets`` [B, T] (slot i
    predicts ``targets[:, i]``), or without them of the next slot's token (T - 1 predictions). On a mesh: hidden
    states batch-sharded, the vocabulary split over the model axis. With ``temperatures`` [K]: (``TokenStats``,
    ``TemperedStats``) from the same scan."""
    hidden = model.hidden_states(ids, segment_ids=segment_ids)
    if mesh is not None:  # before any slicing: XLA then keeps every op after it on each device's own rows
        hidden = jax.lax.with_sharding_constraint(hidden, shd.batch_sharding(mesh, 3))
    if targets is None:
        hidden, targets = hidden[:, :-1], ids[:, 1:]
    if mesh is None:
        return token_stats_from_hidden(hidden, model.unembedding(), targets, vocab_size=vocab, chunk_size=chunk_size,
                                       temperatures=temperatures)
    return token_stats_from_hidden_sharded(hidden, model.unembedding(), targets, mesh=mesh,
                                           vocab_size=vocab, chunk_size=chunk_size, vocab_axis=shd.VOCAB_AXIS,
                                           batch_axes=shd.BATCH_AXES, temperatures=temperatures)


def make_stats_fn(loaded, chunk_size: int | None = None, mesh=None):
    """A jitted ``(state, ids [B, T]) -> TokenStats [B, T-1]``: the forward pass fused with the statistics, one text
    per row. With ``mesh``: ids and outputs are batch-sharded and the statistics run per vocabulary shard."""
    graphdef, chunk_size = nnx.split(loaded.model)[0], chunk_size or default_chunk()
    vocab = real_vocab_size(loaded)

    def stats_fn(state, ids):
        model = nnx.merge(graphdef, state if mesh is None else shd.gathered_for_lookup(state, mesh))
        return _token_stats(model, ids, vocab, chunk_size, mesh)

    return jax.jit(stats_fn) if mesh is None else jax.jit(stats_fn, out_shardings=shd.batch_sharding(mesh, 2))

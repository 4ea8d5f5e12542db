"""texts -> tokens -> length buckets -> jit forward -> token statistics -> scores -> JSONL records.

Tokenization is the model's own tokenizer with its default special tokens (``tokenizer.encode``),
so a model whose Hugging Face tokenizer adds BOS gets BOS here too (recorded as ``add_bos``).
Token i >= 1 is predicted from tokens < i; the first token has no prediction. Texts longer than
the model's context are *truncated* to it (the record says ``"truncated": true``); no windowing.

Batches are right-padded to a fixed set of bucket lengths with a fixed batch size (``mia_jax.batching``:
four buckets per octave, a bucket's last short batch filled with dummy rows up to a power of two), so a whole
dataset compiles a handful of programs, not one per length. Attention is causal, so right padding never changes
the real tokens' logits. One batch is in flight while the host scores the one before it (JAX dispatch is
asynchronous), so host work hides behind the device.

``score_texts`` is one pass (texts -> records); ``score_dataset`` runs the main pass and then the second pass of
each multi-pass method (``mia_jax.passes`` says which texts and model each reads, ``scorers.MULTI_PASS`` how its
scores combine).

With a ``mesh`` (``sharding.make_mesh``) the parameters are placed by the architecture's partition
rules, each batch's rows are padded to a multiple of the batch shards (``data`` x ``fsdp``) and split
over them, and the forward is fused with the vocabulary-sharded statistics
(``stats.token_stats_from_hidden_sharded``). On several processes (``sharding.initialize_distributed``)
each process tokenizes and scores its own contiguous slice of the texts; the batches run in lockstep
(the same (rows, length) shapes on every process, a process with fewer texts in a bucket feeding
dummy rows), and the records are gathered so that every process returns all of them and process 0
writes the files.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import weakref
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax import passes
from mia_jax import sharding as shd
from mia_jax.audits import windowed
from mia_jax.batching import bucket_lengths, pad_ids, plan_batches, real_vocab_size, schedule
from mia_jax.errors import UserError
from mia_jax.files import write_jsonl
from mia_jax.metrics import scores_by_method
from mia_jax.rundir import check_interrupted
from mia_jax.scorers import MULTI_PASS, TokenBatch, is_multi_pass, parse_method, score_batch
from mia_jax.scorers.base import check_resources
from mia_jax.stats import DEFAULT_CHUNK, TokenStats, token_stats_from_hidden, token_stats_from_hidden_sharded

__all__ = ["Encoded", "encode", "make_stats_fn", "shared_stats_fn", "read_done", "score_texts", "score_dataset",
           "run_fingerprint", "real_vocab_size", "scores_by_method"]  # the last two live in batching and metrics


@dataclass
class Encoded:
    ids: list[int]
    truncated: bool
    n_context: int = 0  # leading tokens of a prefix: read as context, never scored


def encode(loaded, texts: Sequence[str], prefixes: Sequence[str] | None = None) -> list[Encoded]:
    """Token ids as the model's tokenizer gives them by default, cut to the context length.

    With ``prefixes``: each text read after its prefix, tokenized apart and joined (the prefix's ids, then the
    text's without the BOS the tokenizer may add), so the text's own tokens are the ones it has alone; the prefix
    tokens are context (``n_context``), its last one predicts the text's first token. When the two do not fit the
    context, the prefix loses tokens from its start (``truncated``); a text that alone exceeds it is cut as
    without a prefix and read with no context."""
    texts = list(texts)
    out = []
    if prefixes is None:
        for enc in loaded.tokenizer.encode_batch(texts):
            ids = enc.ids
            out.append(Encoded(ids[: loaded.max_length], len(ids) > loaded.max_length))
        return out
    if len(prefixes) != len(texts):
        raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts")
    bos = loaded.bos_token_id if loaded.add_bos else None
    for enc, pre in zip(loaded.tokenizer.encode_batch(texts), loaded.tokenizer.encode_batch(list(prefixes))):
        ids, ctx = enc.ids, pre.ids
        if bos is not None and ids[:1] == [bos]:
            ids = ids[1:]
        room = loaded.max_length - len(ids)
        if room <= 0:
            out.append(Encoded(enc.ids[: loaded.max_length], True))
            continue
        n_keep = min(room, len(ctx))
        lead = 1 if n_keep < len(ctx) and bos is not None and ctx[:1] == [bos] else 0  # a cut prefix keeps its BOS
        keep = ctx[:lead] + ctx[len(ctx) - (n_keep - lead):]
        out.append(Encoded(keep + ids, len(keep) < len(ctx), len(keep)))
    return out


def make_stats_fn(loaded, chunk_size: int = DEFAULT_CHUNK, mesh=None):
    """A jitted ``(state, ids [B, T]) -> TokenStats [B, T-1]``: the forward pass fused with the statistics.
    With ``mesh``: ids and outputs are batch-sharded and the statistics run per vocabulary shard."""
    return _stats_fn(nnx.split(loaded.model)[0], real_vocab_size(loaded), chunk_size, mesh)


_SHARED: "weakref.WeakKeyDictionary[nnx.Module, dict]" = weakref.WeakKeyDictionary()


def shared_stats_fn(loaded, chunk_size: int = DEFAULT_CHUNK, mesh=None):
    """``make_stats_fn`` made once per (model, vocabulary, chunk size, mesh) and reused by every pass over the
    same model (main, lowercase, neighbour texts), so a bucket shape compiles once per model, not once per pass."""
    vocab = real_vocab_size(loaded)
    fns = _SHARED.setdefault(loaded.model, {})
    if (vocab, chunk_size, mesh) not in fns:
        fns[vocab, chunk_size, mesh] = make_stats_fn(loaded, chunk_size, mesh)
    return fns[vocab, chunk_size, mesh]


def _stats_fn(graphdef, vocab: int, chunk_size: int, mesh=None):
    if mesh is None:
        @jax.jit
        def fn(state, ids):
            model = nnx.merge(graphdef, state)
            hidden = model.hidden_states(ids)
            return token_stats_from_hidden(hidden[:, :-1], model.unembedding(), ids[:, 1:],
                                           vocab_size=vocab, chunk_size=chunk_size)

        return fn

    @partial(jax.jit, out_shardings=shd.batch_sharding(mesh, 2))
    def sharded_fn(state, ids):
        model = nnx.merge(graphdef, shd.gathered_for_lookup(state, mesh))
        hidden = jax.lax.with_sharding_constraint(model.hidden_states(ids), shd.batch_sharding(mesh, 3))
        return token_stats_from_hidden_sharded(hidden[:, :-1], model.unembedding(), ids[:, 1:], mesh=mesh,
                                               vocab_size=vocab, chunk_size=chunk_size, vocab_axis=shd.VOCAB_AXIS,
                                               batch_axes=shd.BATCH_AXES)

    return sharded_fn


def _skip_reason(text: str, n_tokens: int) -> str | None:
    if not text.strip():
        return "empty or whitespace-only text"
    if n_tokens < 2:
        return f"fewer than 2 tokens ({n_tokens}): nothing to predict"
    return None


def _record(index: int, label, enc: Encoded, scores: dict[str, float], skip: str | None) -> dict:
    rec = {"index": index}
    if label is not None:
        rec["label"] = int(label)
    rec["n_tokens"] = len(enc.ids)
    if enc.n_context:
        rec["n_context"] = enc.n_context  # of n_tokens, the prefix's (read, not scored)
    # NaN is not JSON: a missing score is null and the record says why
    rec["scores"] = {m: _json_score(v) for m, v in scores.items()}
    if enc.truncated:
        rec["truncated"] = True
    if skip:
        rec["skip_reason"] = skip
    return rec


def read_done(path: str | os.PathLike, n_texts: int, methods: Sequence[str]) -> dict[int, dict]:
    """Records already in a results file from an interrupted run, by index.

    A torn last line (the process was killed mid-write) is ignored; a record for another set of
    methods or an index out of range means the file belongs to a different run (UserError).
    """
    done: dict[int, dict] = {}
    path = Path(path)
    if not path.exists():
        return done
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn write
        if not (isinstance(rec, dict) and 0 <= rec.get("index", -1) < n_texts and list(rec["scores"]) == list(methods)):
            raise UserError(f"{path}: line {lineno} does not belong to this run (other data or methods); "
                            "use another --out or --overwrite")
        done[rec["index"]] = rec
    return done


def _part_path(out_path) -> Path:
    """This process's own records file in a multi-process run (merged into ``out_path`` at the end)."""
    return Path(f"{out_path}.process{jax.process_index()}-of-{jax.process_count()}")


def score_texts(loaded, texts: Sequence[str], methods: Sequence[str], *, labels: Sequence[int] | None = None,
                batch_size: int = 8, chunk_size: int = DEFAULT_CHUNK, out_path: str | os.PathLike | None = None,
                resume: bool = False, progress: bool = True, desc: str = "scoring", mesh=None,
                report: dict | None = None, prefixes: Sequence[str] | None = None,
                resources: dict | None = None, compute=None, window: int | None = None) -> list[dict]:
    """Score every text with every method; returns records in input order.

    ``prefixes`` (one string per text): each text is read after its prefix and only the text's tokens are scored
    (``encode``; ReCaLL's conditional likelihood, CAMIA's repeated text). ``resources``: what scorers that name
    one need (``scorers.check_resources``; e.g. DC-PDD's ``freq_table``). ``window``: each record also holds the
    methods' scores of every ``window``-token chunk of the text from the same pass (``audits.windowed``; online
    detection). ``compute`` replaces the forward +
    statistics + scorers of a batch by another batched computation, ``compute(ids [rows, T] int32, mask [rows,
    T-1], texts) -> {method: float64 [rows]}`` (e.g. ``gradnorm``: a forward and a backward), with the same
    buckets, records and resume.

    When ``out_path`` is given, records are appended to it as each batch finishes (so a crash
    loses at most the two batches in flight), and the file is rewritten in input order at the end. With
    ``resume=True`` the records already in ``out_path`` are kept and only the batches that are not
    complete there are computed; batches are planned over the whole dataset either way, so a resumed
    run computes every batch exactly as an uninterrupted one and writes a byte-identical file.

    ``mesh`` (a ``jax.sharding.Mesh`` from ``sharding.make_mesh``): shard the parameters (``loaded.model`` is
    placed on the mesh in place) and the batches over it (see the module docstring). On several processes every
    process must call this with the same arguments; each appends its own records to
    ``<out_path>.process<i>-of-<n>`` as it goes, and process 0 writes ``out_path`` at the end (the part files are
    then removed).

    ``report`` (a dict, filled in): ``texts`` (this process's), ``reused`` (records taken from ``out_path``),
    ``computed`` (texts scored by a forward pass here), ``batches_computed``, ``skipped``. A resume that reuses
    records says so on stderr.
    """
    if compute is None:
        for m in methods:
            parse_method(m)
        check_resources(methods, resources)
    if window is not None:
        windowed.check_window(window, methods, loaded.max_length)
        needs_text = any(getattr(parse_method(m)[0], "needs_text", False) for m in methods)
        decode = loaded.tokenizer.decode if needs_text else None
    multi = mesh is not None and jax.process_count() > 1
    mine = shd.process_slice(len(texts)) if multi else range(len(texts))
    encoded = dict(zip(mine, encode(loaded, [texts[i] for i in mine],
                                    None if prefixes is None else [prefixes[i] for i in mine])))
    label = (lambda i: labels[i]) if labels is not None else (lambda i: None)  # noqa: E731
    sink_path = _part_path(out_path) if (multi and out_path) else out_path
    records: dict[int, dict] = {}
    if out_path and resume:
        records = read_done(out_path, len(texts), methods)
        if multi:
            records.update(read_done(sink_path, len(texts), methods))
        records = {i: r for i, r in records.items() if i in mine}
    skips = {i: _skip_reason(texts[i], len(encoded[i].ids) - encoded[i].n_context + bool(encoded[i].n_context))
             for i in mine}
    for i, reason in skips.items():
        if reason is not None:
            records[i] = _record(i, label(i), encoded[i], {m: None for m in methods}, reason)
    todo = [i for i in mine if skips[i] is None]
    buckets = bucket_lengths(loaded.max_length)
    lengths = [len(encoded[i].ids) for i in todo]
    plan = [(t, [todo[j] for j in local]) for t, local in plan_batches(lengths, buckets, batch_size)]
    if mesh is not None:
        shd.shard_model(loaded.model, mesh)
    row_multiple = shd.local_batch_shards(mesh) if mesh is not None else 1
    steps = schedule(plan, buckets, batch_size, row_multiple, lambda idx: all(i in records for i in idx),
                     shd.allgather_ints if multi else None)
    # texts whose batch is finished are reused; a batch finished only in part is computed again, whole (a step kept
    # only to stay in lockstep with other processes computes nothing here)
    remaining = sum(len(idx) for _, _, idx in steps if not all(i in records for i in idx))
    reused = len(todo) - remaining
    counts = {"texts": len(mine), "reused": reused, "computed": 0, "batches_computed": 0,
              "skipped": len(mine) - len(todo)}
    if report is not None:
        report.update(counts)
        counts = report
    if reused and shd.is_main_process():
        print(f"{desc}: resuming from {out_path}: {reused} of {len(todo)} texts already scored, "
              f"{len(todo) - reused} to compute", file=sys.stderr, flush=True)

    sink = None
    if sink_path:  # start from a clean file holding exactly the records kept so far
        write_jsonl(sink_path, [records[i] for i in sorted(records)])
        sink = open(sink_path, "a", encoding="utf-8")
    try:
        stats_fn = shared_stats_fn(loaded, chunk_size, mesh)
        _, state = nnx.split(loaded.model)
        pad = loaded.pad_token_id if loaded.pad_token_id is not None else 0
        bar = tqdm(total=len(todo), initial=reused, desc=desc, unit="text",
                   disable=not progress or not shd.is_main_process())

        def dispatch(step):  # returns at once: the computation runs while the previous batch is scored
            t, rows, idx = step
            ids, real = pad_ids([encoded[i].ids for i in idx], rows, t, pad)
            mask = real[:, 1:].copy()  # the predicted tokens: every real token after the first, less the context
            for r, i in enumerate(idx):
                mask[r, : max(encoded[i].n_context - 1, 0)] = False
            if compute is not None:
                return idx, mask, ids
            out = stats_fn(state, jnp.asarray(ids) if mesh is None else shd.global_batch(mesh, ids))
            return idx, mask, (ids, out)

        def finish(idx, mask, out):
            if compute is not None:
                if not idx or all(i in records for i in idx):
                    return
                scores = {m: np.asarray(v, np.float64)[: len(idx)]
                          for m, v in compute(out, mask, [texts[i] for i in idx]).items()}
            else:
                ids, out = out
                stats = TokenStats(*(np.asarray(jax.device_get(x)) if mesh is None else shd.host_local_rows(x, mesh)
                                     for x in out))
                if not idx or all(i in records for i in idx):
                    return  # only here to keep the processes in step
                real = slice(0, len(idx))
                batch = TokenBatch(type(stats)(*(x[real] for x in stats)), mask[real], [texts[i] for i in idx],
                                   ids[real, 1:], resources or {})
                scores = score_batch(batch, methods)
                wins = windowed.window_scores(batch, methods, window, decode) if window is not None else None
            counts["computed"] += len(idx)
            counts["batches_computed"] += 1
            for r, i in enumerate(idx):
                records[i] = _record(i, label(i), encoded[i], {m: scores[m][r] for m in methods}, None)
                if compute is None and wins is not None:
                    records[i]["windows"] = wins[r]
            if sink:
                sink.write("".join(json.dumps(records[i]) + "\n" for i in idx))
                sink.flush()
            bar.update(len(idx))
            check_interrupted()  # a Ctrl-C that Python swallowed (see rundir) stops here, after the batch is saved

        pending = None
        for step in steps:  # one batch in flight while the host scores the one before
            current = dispatch(step)
            if pending is not None:
                finish(*pending)
            pending = current
        if pending is not None:
            finish(*pending)
        bar.close()
    finally:
        if sink:
            sink.close()
    if multi:
        records = {r["index"]: r for part in shd.allgather_json([records[i] for i in mine]) for r in part}
    ordered = [records[i] for i in range(len(texts))]
    if out_path and shd.is_main_process():
        write_jsonl(out_path, ordered)
    if multi and out_path:
        shd.sync(f"score_texts:{out_path}")
        Path(sink_path).unlink(missing_ok=True)
    return ordered


def score_dataset(loaded, texts: Sequence[str], methods: Sequence[str], *, ref=None, neighbors=None,
                  labels: Sequence[int] | None = None, out_dir: str | os.PathLike | None = None, resume: bool = False,
                  report: dict | None = None, pass_options: dict | None = None, **kwargs) -> list[dict]:
    """All methods, single- and multi-pass: the main pass, then one more pass of the same path per
    multi-pass method (``lowercase``: the lowercased texts; ``ref``: the reference model ``ref``, a
    LoadedModel with its own tokenizer; ``neighbor``: every text's neighbours, flattened, from the
    generator ``neighbors`` (default ``neighbors.SelfNeighbors(loaded, n=10, seed=0)``; see
    ``passes.neighbor_pass``)). Each pass writes ``out_dir/passes/<kind>.jsonl`` as it goes (``<kind>.<score>``
    when it folds another score than ``loss``; a pass two methods need runs once)
    and resumes from it; ``out_dir/results.jsonl`` holds the final records (``nan_reasons`` says why a
    method's score is null when the text itself was scored; with ``neighbor``, ``n_neighbors`` and
    ``n_identical_neighbors`` count the neighbours scored and dropped). ``report`` (a dict) receives
    ``score_texts``' counts per pass name. ``pass_options`` go to the passes that take more (``passes.prepare``),
    ``kwargs`` to ``score_texts``.
    """
    pass_options = pass_options or {}
    report = {} if report is None else report
    multi = [m for m in methods if is_multi_pass(m)]
    if any("ref" in MULTI_PASS[m].kinds for m in multi) and ref is None:
        raise UserError("method 'ref' needs a reference model (--ref-model)")
    single = [m for m in methods if m not in multi]
    main_methods = list(single)
    for m in multi:  # each multi-pass method compares its pass_method score of the main pass with its second pass's
        if MULTI_PASS[m].pass_method not in main_methods:
            main_methods.append(MULTI_PASS[m].pass_method)
    check_resources(main_methods, kwargs.get("resources"))
    out_passes = Path(out_dir, "passes") if out_dir else None
    if out_passes:
        out_passes.mkdir(parents=True, exist_ok=True)
    path = (lambda name: out_passes / f"{name}.jsonl") if out_passes else (lambda name: None)  # noqa: E731
    desc = kwargs.pop("desc", "scoring")
    main = score_texts(loaded, texts, main_methods, labels=labels, out_path=path("main"), resume=resume,
                       report=report.setdefault("main", {}), desc=desc, **kwargs)
    extra: dict[str, tuple[np.ndarray, dict[int, str]]] = {}
    counts: dict[str, list[int]] = {}
    done: dict[tuple[str, str], tuple[np.ndarray, dict[int, str]]] = {}  # a pass shared by methods runs once
    for m in multi:
        method = MULTI_PASS[m]
        others, pass_reasons = [], {}
        for kind in method.kinds:
            key = (kind, method.pass_method)
            name = kind if method.pass_method == "loss" else f"{kind}.{method.pass_method}"
            if key not in done:
                second = passes.prepare(kind, name, loaded, texts, ref=ref, neighbors=neighbors, out_dir=out_dir,
                                        out_path=path(name), resume=resume, method=method.pass_method, **pass_options)
                recs = score_texts(second.model, second.texts, second.methods or [method.pass_method],
                                   out_path=path(name), resume=second.resume, desc=f"{desc} ({name} pass)",
                                   report=report.setdefault(name, {}), prefixes=second.prefixes,
                                   compute=second.compute, **kwargs)
                values, reasons, pass_counts = second.fold(recs)
                done[key] = values, reasons
                counts.update(pass_counts)
            others.append(done[key][0])
            pass_reasons.update(done[key][1])
        main_values = scores_by_method(main, [method.pass_method])[method.pass_method]
        scores, reasons = method.combine(main_values, *others, texts)
        extra[m] = scores, {**reasons, **pass_reasons}  # the pass's own reason is the more specific
    records = []
    for i, rec in enumerate(main):
        rec = dict(rec, scores={m: rec["scores"][m] if m in single else _json_score(extra[m][0][i]) for m in methods})
        nan_reasons = {m: extra[m][1][i] for m in multi if i in extra[m][1] and "skip_reason" not in rec}
        if nan_reasons:
            rec["nan_reasons"] = nan_reasons
        rec.update({k: v[i] for k, v in counts.items()})
        records.append(rec)
    if out_dir and shd.is_main_process():
        write_jsonl(Path(out_dir, "results.jsonl"), records)
    return records


def run_fingerprint(loaded, texts: Sequence[str], labels: Sequence[int] | None, methods: Sequence[str], *,
                    ref=None, neighbors=None, data_files: dict | None = None, **options) -> dict:
    """What defines a ``score_dataset`` run, for ``rundir.claim``: the methods, every model file and data file
    by resolved path and SHA-256, the texts and labels themselves (their SHA-256), the neighbour generator's
    config, the package version and ``options`` (batch size, chunk size, dtype, ...: anything else that can
    change a record)."""
    from mia_jax import __version__

    def resolved(files):
        return {str(Path(p).resolve()): h for p, h in files.items()} if files is not None else None

    blob = json.dumps([list(texts), list(labels) if labels is not None else None], ensure_ascii=False)
    return {"methods": list(methods), "model_files": resolved(loaded.files),
            "ref_model_files": resolved(ref.files) if ref is not None else None,
            "data_files": resolved(data_files), "texts_sha256": hashlib.sha256(blob.encode("utf-8")).hexdigest(),
            "n_texts": len(texts),
            "neighbors": {"name": neighbors.name, "config": neighbors.config} if neighbors is not None else None,
            **options, "package_version": __version__}


def _json_score(v) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)

"""texts -> tokens -> packed rows -> one jitted step (forward, statistics, scores) -> JSONL records.

Tokenization is the model's own tokenizer with its default special tokens (``batching.encode``),
so a model whose Hugging Face tokenizer adds BOS gets BOS here too (recorded as ``add_bos``).
Token i >= 1 is predicted from tokens < i; the first token has no prediction. Texts longer than
the model's context are *truncated* to it (the record says ``"truncated": true``); no windowing.

A pass is three parts: the plan (``batching.encode`` and ``batching.pack``: texts packed into rows of a token
budget, each text its own segment, at most two step shapes for a dataset of short texts), the device step
(``score_step.make_score_step``: the forward over the packed rows, the float32 statistics, each text's scores by
its one ``jax.numpy`` formula, all in one program) and the record sink (``records.Sink``: records appended as
steps finish, resume, multi-host gathering). Steps run while the host writes the records of those before them
(``inflight.InFlight``: one in flight on accelerators, two at once on the CPU).

``score_texts`` is one pass; ``score_dataset`` the main pass, then the second pass of each multi-pass method
(``mia_jax.engine.passes``: which texts and model; ``scorers.MULTI_PASS``: how its scores combine).

With a ``mesh`` (``sharding.make_mesh``) the parameters are placed by the architecture's partition
rules, each step's rows are padded to a multiple of the batch shards (``data`` x ``fsdp``) and split
over them, and the forward is fused with the vocabulary-sharded statistics
(``stats.token_stats_from_hidden_sharded``). On several processes each tokenizes and scores its own slice of the
texts in lockstep (``batching.align``: the same shapes everywhere, empty rows where a process has fewer texts); the
records are gathered, process 0 writes the files. After each step every process asks ``preemption.agreed()``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax.runs import processes
from mia_jax.engine import passes
from mia_jax.runs import preemption
from mia_jax.engine import sharding as shd
from mia_jax.engine import windowed
from mia_jax.batching import (TOKENS_PER_BATCH, Step, align, check_tokens_per_batch, encode, pack, packed_arrays,
                              scoring_lengths, stable_steps)
from mia_jax.runs.entry import check_interrupted
from mia_jax.errors import UserError
from mia_jax.runs.files import write_jsonl
from mia_jax.engine.inflight import InFlight
from mia_jax.runs.fingerprint import run_fingerprint
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.engine.records import Sink, make_record, skip_reason
from mia_jax.engine.score_step import shared_score_step
from mia_jax.scorers import (MULTI_PASS, check_ids, check_resources, is_multi_pass, pack_token_resources, parse_method,
                             requirements, resource_arrays, token_resources)
from mia_jax.scorers.likelihood import zlib_bytes
from mia_jax.stats import TokenStats

__all__ = ["NONFINITE", "nonfinite_texts", "default_tokens_per_batch", "score_texts", "score_dataset",
           "run_fingerprint", "default_dtype"]


NONFINITE = "the model's logits are not finite"  # the skip reason of such a text (counted and warned by the CLI)


def nonfinite_texts(records) -> list[int]:
    """Indices of the ``records`` skipped because the model's logits were NaN or infinite (:data:`NONFINITE`)."""
    return [i for i, r in enumerate(records) if (r.get("skip_reason") or "").startswith(NONFINITE)]


def default_tokens_per_batch() -> int:
    """The token budget of one scoring step on this backend (``batching.TOKENS_PER_BATCH``)."""
    return TOKENS_PER_BATCH.get(jax.default_backend(), TOKENS_PER_BATCH["gpu"])


def score_texts(loaded, texts: Sequence[str], methods: Sequence[str], *, labels: Sequence[int] | None = None,
                tokens_per_batch: int | None = None, batch_size: int = 8, chunk_size: int | None = None,
                out_path: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
                desc: str = "scoring", mesh=None, report: dict | None = None, prefixes: Sequence[str] | None = None,
                resources: dict | None = None, compute=None, window: int | None = None, shapes: set | None = None,
                stable: tuple[int, int] | None = None) -> list[dict]:
    """Score every text with every method; returns records in input order.

    Texts (each text's tokens but its last) are packed into rows of a token budget (``batching.pack``) and each step
    runs ``score_step.make_score_step``'s program: the forward, the statistics and every method's formula on the
    device; only per-text scores come back (and per-token statistics with ``window``).

    Args:
        loaded: the model (``models.load``), its tokenizer with it.
        texts: the texts.
        methods: single-pass method names.
        labels: one label per text (1 = member), copied into the records; or None.
        tokens_per_batch: the token budget of a step (default per backend: ``default_tokens_per_batch``).
        batch_size: rows per step with ``compute``.
        chunk_size: the statistics' vocabulary chunk (default ``stats.default_chunk()``).
        out_path: records appended as each step finishes (``records.Sink``: a crash loses at most the steps in
            flight; a preemption notice, none: ``preemption.Preempted`` once the steps in flight are saved), the
            file rewritten in input order at the end.
        resume: True: the records in ``out_path`` are kept, only the steps not complete there computed; steps are
            planned over the whole dataset either way (a byte-identical file).
        progress, desc: a progress bar (process 0's), labelled ``desc``.
        mesh: (``sharding.make_mesh``) the parameters (``loaded.model``, in place) and the rows sharded over it. On
            several processes every process calls this with the same arguments; each appends its own records to
            ``<out_path>.process<i>-of-<n>`` as it goes, and process 0 writes ``out_path`` at the end.
        report: a dict, filled in: ``texts`` (this process's), ``reused`` (records taken from ``out_path``),
            ``computed`` (texts scored by a forward pass here), ``batches_computed`` (steps), ``skipped``, ``slots``
            and ``tokens`` (token slots of the steps run vs the tokens fed), ``scoring_programs`` (the distinct step
            shapes run).
        prefixes: one string per text: each text is read after its prefix and only the text's tokens are scored
            (``encode``; ReCaLL's conditional likelihood, CAMIA's repeated text).
        resources: what scorers that name one need (``scorers.check_resources``; e.g. DC-PDD's ``freq_table``).
        compute: replaces the forward + statistics + scorers of a batch by another batched computation on one text
            per row, ``batch_size`` rows per step, ``compute(ids [rows, T] int32, mask [rows, T-1], texts) ->
            {method: float64 [rows]}`` (e.g. ``gradnorm``: a forward and a backward), with the same records and
            resume.
        window: each record also holds the methods' scores of every ``window``-token chunk of the text from the
            same pass (``audits.windowed``; online detection).
        shapes: a set collecting the distinct step shapes over several calls.
        stable: (row length, segments): every packed row that long (longer texts in rows of their own), steps
            padded to shapes that calls over other texts share (a corpus scored a window at a time:
            ``batching.stable_steps``).

    Returns:
        One record (a dict: ``index``, ``label``, ``n_tokens``, ``scores`` {method: float or None}, ...; see
        ``records.make_record``) per text, in input order (gathered from every process).
    """
    tokens_per_batch = _check_arguments(loaded, methods, tokens_per_batch, compute, resources, window)
    p = _start(loaded, texts, methods, labels=labels, prefixes=prefixes, out_path=out_path, resume=resume,
               mesh=mesh, compute=compute, resources=resources, window=window)
    todo = [i for i in p.mine if p.skips[i] is None]
    if mesh is not None:
        shd.shard_model(loaded.model, mesh)
    enc = [p.encoded[i] for i in todo]  # a scoring pass feeds each text but its last token, which predicts nothing
    steps = _plan(loaded, scoring_lengths(enc) if compute is None else [len(e.ids) for e in enc], todo,
                  tokens_per_batch, batch_size, mesh, p.multi, compute is None,
                  lambda idx: all(i in p.sink for i in idx), stable[0] if stable else None)
    if stable:
        steps = stable_steps(steps, tokens_per_batch, *stable, shd.local_batch_shards(mesh) if mesh is not None else 1)
    p.shapes = shapes if shapes is not None else p.shapes
    reused = _count_resumed(p, steps, todo, report, desc, out_path)
    p.sink.open()
    try:
        _, p.state = nnx.split(loaded.model)
        p.pad = loaded.pad_token_id if loaded.pad_token_id is not None else 0
        p.step_fn = None if compute is not None else shared_score_step(loaded, methods, chunk_size, mesh,
                                                                         window is not None)
        p.res = resource_arrays(methods, resources, per_token=False) if compute is None else {}
        p.bar = tqdm(total=len(todo), initial=reused, desc=desc, unit="text",
                     disable=not progress or not processes.is_main_process())
        with InFlight.for_backend(mesh) as p.flight:  # steps run while the host writes those before (inflight.py)
            for step in steps:
                for done in p.flight.add(_dispatch(p, step)):
                    _finish(p, *done)
                if preemption.agreed():  # a notice to any process: every process stops after this same step
                    for done in p.flight.drain():
                        _finish(p, *done)
                    saved = len(p.sink.records)
                    saved = int(processes.allgather_ints([saved]).sum()) if p.multi else saved
                    raise preemption.Preempted(f"{saved} of {len(texts)} texts")
            for done in p.flight.drain():
                _finish(p, *done)
        p.bar.close()
    finally:
        p.sink.close()
    p.counts["scoring_programs"] = len(p.shapes)
    return p.sink.finish()


@dataclass
class _Pass:
    """One ``score_texts`` pass: its inputs and the state its phases share (plan, resume, step loop, finish)."""
    texts: Sequence[str]
    methods: Sequence[str]
    labels: Sequence[int] | None
    mesh: object
    compute: object
    window: int | None
    resources: dict | None
    needs_text: bool  # zlib: each text's compressed length
    decode: object  # the tokenizer's decode for windowed zlib, else None
    multi: bool  # several processes, each scoring its own slice
    mine: Sequence[int]  # this process's texts
    encoded: dict  # {index: batching.Encoded}
    skips: dict  # {index: skip reason or None}
    sink: Sink
    counts: dict = field(default_factory=dict)
    shapes: set = field(default_factory=set)
    state: object = None  # the model's state (nnx.split)
    pad: int = 0
    step_fn: object = None
    res: dict = field(default_factory=dict)  # the scorers' resources as arrays
    bar: object = None
    flight: InFlight | None = None  # the steps launched and not yet finished
    token_res: dict = field(default_factory=dict)  # {per-token resource: {index: array over the text's tokens}}

    def label(self, i: int) -> int | None:
        """Text ``i``'s label, or None without labels."""
        return self.labels[i] if self.labels is not None else None


def _check_arguments(loaded, methods, tokens_per_batch, compute, resources, window) -> int:
    """The arguments of ``score_texts`` checked (a ``UserError`` or ``ValueError`` if wrong); returns the token
    budget of a step."""
    if compute is None:
        for m in methods:
            parse_method(m)
        check_resources(methods, resources)
    tokens_per_batch = check_tokens_per_batch(tokens_per_batch, "tokens_per_batch") or default_tokens_per_batch()
    if window is not None:
        windowed.check_window(window, methods, loaded.max_length)
    return tokens_per_batch


def _start(loaded, texts, methods, *, labels, prefixes, out_path, resume, mesh, compute, resources, window) -> _Pass:
    """A pass's texts encoded (this process's slice), its sink opened for resume and the records of the texts it
    skips added to it; returns the pass."""
    needs_text = compute is None and requirements(methods).zlib_bytes
    decode = loaded.tokenizer.decode if window is not None and needs_text else None
    multi = mesh is not None and jax.process_count() > 1
    mine = processes.process_slice(len(texts)) if multi else range(len(texts))
    encoded = dict(zip(mine, encode(loaded, [texts[i] for i in mine],
                                    None if prefixes is None else [prefixes[i] for i in mine])))
    sink = Sink(out_path, len(texts), methods, mine, resume=resume, multi=multi)
    skips = {i: skip_reason(texts[i], len(encoded[i].ids) - encoded[i].n_context + bool(encoded[i].n_context))
             for i in mine}
    p = _Pass(texts, methods, labels, mesh, compute, window, resources, needs_text, decode, multi, mine, encoded,
              skips, sink)
    for i, reason in skips.items():
        if reason is not None:
            sink.records[i] = make_record(i, p.label(i), encoded[i], {m: None for m in methods}, reason)
    if compute is None:  # per-token resources made from each text, e.g. Tag&Tab's keywords
        p.token_res = token_resources(methods, resources, loaded.tokenizer, {i: texts[i] for i in mine},
                                      alone=prefixes is None and window is None)
    return p


def _count_resumed(p: _Pass, steps: list[Step], todo: list[int], report: dict | None, desc: str, out_path) -> int:
    """The pass's counts started (in ``report`` when given) and a resume that reuses records said on stderr;
    returns how many texts to score are already in the sink."""
    remaining = sum(len(s.items) for s in steps if not all(i in p.sink for i in s.items))
    reused = len(todo) - remaining
    p.counts = {"texts": len(p.mine), "reused": reused, "computed": 0, "batches_computed": 0,
                "skipped": len(p.mine) - len(todo), "slots": 0, "tokens": 0, "scoring_programs": 0}
    if report is not None:
        report.update(p.counts)
        p.counts = report
    if reused and processes.is_main_process():
        print(f"{desc}: resuming from {out_path}: {reused} of {len(todo)} texts already scored, "
              f"{len(todo) - reused} to compute", file=sys.stderr, flush=True)
    return reused


def _dispatch(p: _Pass, step: Step) -> tuple:
    """Step ``step`` started; returns at once (step, its scored-prediction mask, its device output (on the CPU a
    worker's future) or, with ``compute``, its ids): it runs while the host writes the records of steps before."""
    encoded = p.encoded
    arrays = packed_arrays(step, {i: encoded[i].ids for i in step.items}, p.pad, targets=p.compute is None)
    seg, mask = arrays["segment_ids"], arrays["mask"]  # a scored prediction: of a token of the text, not its prefix
    zb = np.ones((step.rows, step.segments), np.float32)
    for r, row in enumerate(step.contents) if p.needs_text or any(encoded[i].n_context for i in step.items) else ():
        for s, (item, start, _) in enumerate(row):
            mask[r, start: start + max(encoded[item].n_context - 1, 0)] = False
            if p.needs_text:
                zb[r, s] = zlib_bytes(p.texts[item])
    p.shapes.add(step.shape)
    p.counts["slots"] += step.rows * step.length
    p.counts["tokens"] += int((seg > 0).sum())
    if p.compute is not None:
        return step, mask, arrays["ids"]
    if p.res:
        check_ids(p.methods, arrays["targets"], mask, p.res)  # e.g. DC-PDD: an id beyond its table is an error
    batch = {**arrays, "zlib_bytes": zb, **pack_token_resources(p.token_res, step.contents, mask.shape)}
    if p.mesh is not None:
        batch = {k: shd.global_batch(p.mesh, v) for k, v in batch.items()}
    return step, mask, p.flight.launch(p.step_fn, p.state, {**batch, "resources": p.res})


def _finish(p: _Pass, step: Step, mask: np.ndarray, out) -> None:
    """The records of a dispatched step made and added to the sink (unless all are there already)."""
    idx = step.items
    reasons, wins = {}, {}
    if p.compute is not None:
        if not idx or all(i in p.sink for i in idx):
            return
        got = p.compute(out[: len(idx)], mask[: len(idx)], [p.texts[i] for i in idx])
        per_text = {i: {m: float(np.asarray(v, np.float64)[r]) for m, v in got.items()} for r, i in enumerate(idx)}
    else:
        out = InFlight.result(out)
        wanted = {"scores": out["scores"], "nonfinite": out["nonfinite"]}
        if p.window is not None:
            wanted["tokens"] = tuple(out["tokens"])
        # one transfer of all of a step's arrays (each started before any is waited for); a mesh: this host's rows
        got = (jax.device_get(wanted) if p.mesh is None
               else jax.tree.map(lambda x: shd.host_local_rows(x, p.mesh), wanted))
        scores, broken = {m: np.asarray(v) for m, v in got["scores"].items()}, np.asarray(got["nonfinite"])
        tokens = TokenStats(*(np.asarray(x) for x in got["tokens"])) if p.window is not None else None
        if not idx or all(i in p.sink for i in idx):
            return  # only here to keep the processes in step
        per_text = _step_scores(p, step, scores, broken, reasons)
        if tokens is not None:
            wins = windowed.step_window_scores(step, tokens, mask, p.encoded, p.texts, p.methods, p.window, p.decode,
                                               p.resources)
    p.counts["computed"] += len(idx)
    p.counts["batches_computed"] += 1
    recs = [make_record(i, p.label(i), p.encoded[i], per_text[i], reasons.get(i)) for i in idx]
    for rec in (r for r in recs if r["index"] in wins and "skip_reason" not in r):
        rec["windows"] = wins[rec["index"]]
    p.sink.add(recs)
    p.bar.update(len(idx))
    check_interrupted()  # a Ctrl-C that Python swallowed (see rundir) stops here, after the step is saved


def _step_scores(p: _Pass, step: Step, scores: dict, broken: np.ndarray, reasons: dict) -> dict[int, dict]:
    """Each text's scores of a step from the device's [rows, segments] arrays: {index: {method: score or None}};
    a text with non-finite logits gets None scores and its reason in ``reasons``."""
    per_text = {}
    for r, row in enumerate(step.contents):
        for s, (item, _, _) in enumerate(row):
            if broken[r, s]:  # no score of a text the model could not compute is kept
                per_text[item] = {m: None for m in p.methods}
                reasons[item] = f"{NONFINITE}: NaN or infinite at {broken[r, s]} of its scored tokens"
            else:
                per_text[item] = {m: float(scores[m][r, s]) for m in p.methods}
    return per_text


def _plan(loaded, lengths, todo, tokens_per_batch, batch_size, mesh, multi, packed, done,
          row_length=None) -> list[Step]:
    """The steps of a pass over the texts ``todo`` (of these token lengths), aligned across processes; packed rows of
    ``row_length`` when given."""
    row_multiple = shd.local_batch_shards(mesh) if mesh is not None else 1
    choose = longest = None
    if row_length:  # a streamed window on any number of processes: the run's one row length
        longest, choose = row_length, (lambda costs: 0)  # the first candidate: the bucket of row_length
    elif multi:
        longest = int(processes.allgather_ints([max(lengths, default=0)]).max())

        def choose(costs):
            return int(np.argmin(processes.allgather_ints([round(c) for c in costs]).sum(axis=0)))
    local = pack(lengths, tokens_per_batch, loaded.max_length, row_multiple=row_multiple, packed=packed,
                 longest=longest, choose=choose, rows=None if packed else batch_size)
    steps = [Step(s.rows, s.length, s.segments, [[(todo[i], start, n) for i, start, n in row] for row in s.contents])
             for s in local]
    gather = processes.allgather_ints if multi else (lambda v: np.asarray(v, np.int64).reshape(1, -1))
    return align(steps, loaded.max_length, gather, done)


def score_dataset(loaded, texts: Sequence[str], methods: Sequence[str], *, ref=None, neighbors=None,
                  labels: Sequence[int] | None = None, out_dir: str | os.PathLike | None = None, resume: bool = False,
                  report: dict | None = None, pass_options: dict | None = None, **kwargs) -> list[dict]:
    """All methods, single- and multi-pass: the main pass, then one more pass of the same path per multi-pass method
    (``lowercase``: the lowercased texts; ``ref``: the reference model; ``neighbor``: every text's neighbours,
    flattened; see ``passes.neighbor_pass``).

    Args:
        loaded, texts: the model (``models.load``) and the texts.
        methods: method names, single- and multi-pass.
        ref: the reference model of ``ref``, a LoadedModel with its own tokenizer.
        neighbors: the neighbour generator of ``neighbor`` (default ``neighbors.SelfNeighbors(loaded, n=10, seed=0)``).
        labels: one label per text, as ``score_texts``.
        out_dir: each pass writes ``out_dir/passes/<kind>.jsonl`` as it goes (``<kind>.<score>`` when it folds
            another score than ``loss``; a pass two methods need runs once, told them as ``wanted``) and resumes
            from it; ``out_dir/results.jsonl`` holds the final records.
        resume: resume every pass from its file.
        report: a dict, receives ``score_texts``' counts per pass name.
        pass_options: go to the passes that take more (``passes.prepare``).
        **kwargs: go to ``score_texts``.

    Returns:
        One record per text, in input order, as ``score_texts``' with every method's score; ``nan_reasons`` says
        why a method's score is null when the text itself was scored; with ``neighbor``, ``n_neighbors`` and
        ``n_identical_neighbors`` count the neighbours scored and dropped.
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
    extra, counts = {}, {}  # {method: (scores [N], {row: why NaN})}, {record field: [N] per-text counts}
    done: dict[tuple[str, str], tuple[np.ndarray, dict[int, str]]] = {}  # a pass shared by methods runs once
    for m in multi:
        method = MULTI_PASS[m]
        others, pass_reasons = [], {}
        for kind in method.kinds:
            key = (kind, method.pass_method)
            name = kind if method.pass_method == "loss" else f"{kind}.{method.pass_method}"
            if key not in done:
                second = passes.prepare(kind, name, loaded, texts, ref=ref, neighbors=neighbors, out_dir=out_dir,
                                        out_path=path(name), resume=resume, method=method.pass_method,
                                        wanted=[x for x in multi if kind in MULTI_PASS[x].kinds], **pass_options)
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
    records = passes.final_records(main, methods, extra, counts)
    if out_dir and processes.is_main_process():
        write_jsonl(Path(out_dir, "results.jsonl"), records)
    return records


def default_dtype() -> str:
    """The forward's dtype on this backend: bfloat16 on GPU and TPU, float32 on CPU (statistics are float32)."""
    return "bfloat16" if jax.default_backend() in ("gpu", "tpu", "cuda", "rocm") else "float32"

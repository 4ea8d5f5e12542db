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

``score_texts`` is one pass (its phases in ``engine.phases``: start, plan, the step loop, finish); ``score_dataset``
the main pass, then the second pass of each multi-pass method
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
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax.runs import processes
from mia_jax.engine import passes, phases
from mia_jax.engine.phases import NONFINITE, default_tokens_per_batch
from mia_jax.engine import sharding as shd
from mia_jax.errors import UserError
from mia_jax.runs.files import write_jsonl
from mia_jax.runs.fingerprint import run_fingerprint
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.engine.score_step import shared_score_step
from mia_jax.scorers import (MULTI_PASS, check_resources, is_multi_pass, resource_arrays)

__all__ = ["NONFINITE", "nonfinite_texts", "default_tokens_per_batch", "score_texts", "score_dataset",
           "run_fingerprint", "default_dtype"]




def nonfinite_texts(records) -> list[int]:
    """Indices of the ``records`` skipped because the model's logits were NaN or infinite (:data:`NONFINITE`)."""
    return [i for i, r in enumerate(records) if (r.get("skip_reason") or "").startswith(NONFINITE)]


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
    tokens_per_batch = phases.check_arguments(loaded, methods, tokens_per_batch, compute, resources, window)
    p = phases.start(loaded, texts, methods, labels=labels, prefixes=prefixes, out_path=out_path, resume=resume,
                     mesh=mesh, compute=compute, resources=resources, window=window)
    if mesh is not None:
        shd.shard_model(loaded.model, mesh)
    todo, steps = phases.plan_pass(p, loaded, tokens_per_batch, batch_size, stable)
    p.shapes = shapes if shapes is not None else p.shapes
    reused = phases.count_resumed(p, steps, todo, report, desc, out_path)
    p.sink.open()
    try:
        _, p.state = nnx.split(loaded.model)
        p.pad = loaded.pad_token_id if loaded.pad_token_id is not None else 0
        p.step_fn = None if compute is not None else shared_score_step(loaded, methods, chunk_size, mesh,
                                                                         window is not None)
        p.res = resource_arrays(methods, resources, per_token=False) if compute is None else {}
        p.bar = tqdm(total=len(todo), initial=reused, desc=desc, unit="text",
                     disable=not progress or not processes.is_main_process())
        phases.run(p, steps, len(texts))
        p.bar.close()
    finally:
        p.sink.close()
    p.counts["scoring_programs"] = len(p.shapes)
    return p.sink.finish()


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

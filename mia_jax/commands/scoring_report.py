"""The report of an ``eval`` / ``score`` run (:func:`mia_jax.commands.scoring.run` has validated the arguments,
loaded the model and data and claimed the run folder): scoring through ``runner.score_dataset``, then ``run.json``,
the summary tables (metrics, blind baseline, paired comparisons, bold by the paired bootstrap), the windowed report
and the terminal lines."""
from __future__ import annotations

import json
import platform
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from threading import Event

import jax
import numpy as np

from mia_jax.runs import processes
from mia_jax import __version__, data
from mia_jax.evaluation import blind, comparisons, metrics, report
from mia_jax.engine import compilation, sharding, shards
from mia_jax.methods import resources
from mia_jax.audits import concat
from mia_jax.engine import windowed
from mia_jax.evaluation.bootstrap import tpr_key
from mia_jax.data.sample import stratified_sample
from mia_jax.data.stream import StreamDataset
from mia_jax.errors import UserError
from mia_jax.commands.request import OutputRequest, ScoreRequest


def _blind_baseline(ds, output: OutputRequest, required: bool, child: blind.Child | None = None,
                    after: Event | None = None):
    """Metrics of the model-free bag-of-words baseline on the same texts (``output``: the report's --seed and
    --n-bootstrap), and the line that reports it (a streamed
    corpus: on a seeded stratified sample of at most ``blind.SAMPLE_MAX`` texts, read alone, its size in the line);
    its scores from ``child`` when one computes them (``start_blind_baseline``), computed here again should the child
    fail otherwise than by a UserError; the metrics once ``after`` is set."""
    labels, sample = ds.labels, ""
    if isinstance(ds, StreamDataset):
        keep = stratified_sample(ds.labels, blind.SAMPLE_MAX, seed=output.seed)
        texts, labels = ds.texts_at(keep), [int(y) for y in np.asarray(ds.labels)[keep]]
        if len(keep) < len(ds):
            sample = f"; a seeded sample of {len(keep)} of {len(ds)} texts, stratified by label"
    else:
        texts = ds.texts
    try:
        try:
            scores = child.scores() if child is not None else None
        except RuntimeError as e:
            print(f"note: {e}; the blind baseline is computed in this process instead", file=sys.stderr)
            scores = None
        if scores is None:
            scores = blind.blind_bow_scores(texts, [int(y) for y in labels], seed=output.seed)
    except UserError as e:
        if required:
            raise
        return None, f"Blind baseline not computed: {e}"
    if after is not None:
        after.wait()
    m = metrics.evaluate(labels, scores, n_bootstrap=output.n_bootstrap, seed=output.seed)
    if sample:
        m["sample"] = {"n": len(labels), "of": len(ds), "seed": output.seed}
    if m["auroc"] is None:
        return m, f"Blind baseline ({blind.NAME}): {m['note']}."
    ci = m["auroc_ci"] or (float("nan"), float("nan"))
    line = (f"Blind baseline ({blind.NAME}: bag-of-words TF-IDF + logistic regression, {blind.FOLDS}-fold CV, "
            f"no model{sample}): AUROC {report.with_ci(m['auroc'], ci)}, TPR@5%FPR {report.fmt(m['tpr_at_5pct_fpr'])}.")
    warn = blind.warning(m["auroc"])
    return m, line + (f"\n{warn}" if warn else "")


def start_blind_baseline(output: OutputRequest, ds, labeled: bool, blind_asked: bool,
                         after: Event | None = None) -> Future | None:
    """The blind baseline (``_blind_baseline``) of a labeled in-memory dataset, started now, before the model
    loads: from ``blind.CHILD_MIN_TEXTS`` texts its scores in a child process (``blind.Child``: the load runs
    Python under the interpreter lock on one core, the baseline on the other), for fewer on a thread of its own;
    once ``after`` is set (the model loaded), the thread computes the metrics and imports matplotlib for the
    report's plots (~0.4 s off the end) while the texts are scored. None where the report computes it itself (a
    streamed corpus, a process other than the first) or does not report it."""
    if not labeled or not (blind_asked or not output.no_blind) or ds.texts is None or not processes.is_main_process():
        return None
    child = blind.Child(ds.texts, ds.labels, seed=output.seed) if len(ds.texts) >= blind.CHILD_MIN_TEXTS else None
    pool = ThreadPoolExecutor(1, thread_name_prefix="blind-baseline")
    try:
        future = pool.submit(_blind_baseline, ds, output, blind_asked, child, after)
        pool.submit(report.pyplot)
        return future
    finally:
        pool.shutdown(wait=False)  # the submitted work still runs


def _neighbor_meta(generator, records) -> dict:
    return {"name": generator.name, "config": generator.config,
            "n_identical_neighbors": sum(r.get("n_identical_neighbors", 0) for r in records),
            "n_texts_all_identical": sum(1 for r in records if r.get("n_identical_neighbors", 0) == generator.n),
            "n_neighbors_scored": sum(r.get("n_neighbors", 0) for r in records)}


def _paired(scores, labels, pairs, output: OutputRequest) -> list[dict]:
    """comparisons.paired_bootstrap of each --compare pair over the run's ``scores`` ({method: float64 [N]}), from
    at least ``comparisons.VERDICT_RESAMPLES`` resamples, each metric's verdicts Holm-corrected over the pairs."""
    out = []
    for a, b in pairs:
        try:
            res = comparisons.paired_bootstrap(labels, scores[a], scores[b], seed=output.seed,
                                               n_bootstrap=comparisons.verdict_resamples(output.n_bootstrap))
        except ValueError as e:  # e.g. one class left once the texts either method could not score are dropped
            res = {"error": str(e)}
        out.append({"a": a, "b": b, **res})
    for key in ("auroc", tpr_key(0.05)):
        comparisons.holm_adjust([c for c in out if "error" not in c], key)
    return out


def bold_note(m: int) -> str:
    """The note under a run's table that says what its bold means (``m``: the comparisons with the best behind it)."""
    return ("Bold AUROC: the highest and every method that the paired bootstrap on the same texts does not place "
            f"below it (best - method, Holm-corrected over the {m} comparisons with the best at level 0.05; at "
            f"least {comparisons.VERDICT_RESAMPLES} resamples).")


def _tied_with_best(labels, scores, summary, methods, output: OutputRequest) -> tuple[set, int]:
    """(the methods whose AUROC the run's table bolds, the number of comparisons behind it):
    comparisons.compare_to_best from at least ``comparisons.VERDICT_RESAMPLES`` resamples, Holm-corrected, then
    comparisons.tied_with_best; nothing without bootstrap resamples or with fewer than two methods."""
    if output.n_bootstrap < 1 or len(methods) < 2 or len(set(labels)) < 2:
        return set(), 0
    entry = comparisons.compare_to_best(labels, scores, {m: summary[m].get("auroc") for m in methods},
                                        n_bootstrap=comparisons.verdict_resamples(output.n_bootstrap), seed=output.seed)
    m = comparisons.holm_adjust(list(entry["vs"].values()) if entry else [], "auroc")
    return comparisons.tied_with_best(entry), m


def _compile_meta(count: dict) -> dict:
    """run.json's "compile": the scoring programs the run needed (built or read from the persistent cache), the
    seconds they took, how many came from the cache, and the cache folder."""
    return {"scoring_programs": count["programs"], "seconds": count["seconds"], "cache_hits": count["cache_hits"],
            "compiled": count["compiled"], "cache_dir": compilation.cache_dir()}


def score_and_report(request: ScoreRequest, out, resume, ds, loaded, ref, generator, methods, mesh, blind_asked,
                     compare=(), res=None, blind_future: Future | None = None) -> None:
    """Score the dataset ``ds`` (``runner.score_dataset``) into the claimed run folder ``out`` (``resume``: reuse its
    finished batches) and write its report: ``results.jsonl``, ``run.json``, the summary tables and plots, and what
    the terminal shows. ``request``: the run's, resolved (``request.labeled``: an eval, with metrics, rather than a
    score); ``blind_asked``: blind_bow is among
    --methods; ``compare``: the checked --compare pairs; ``res``: the methods' ``resources.Resources``;
    ``blind_future``: the blind baseline already under way (``start_blind_baseline``); the rest as
    :func:`mia_jax.commands.scoring.run` makes them."""
    from mia_jax.engine import runner  # here, not at the top: it loads the model code (start-up time)

    print(f"model {loaded.name} ({loaded.source}), {ds.name}: {len(ds)} texts, methods: {' '.join(methods)}",
          file=sys.stderr)
    t0 = time.perf_counter()
    passes: dict = {}
    res = res or resources.Resources()
    compiled = compilation.CompileCount("score_step")
    plan, labeled, window = request.plan, request.labeled, request.methods.options.window
    common = dict(batch_size=plan.batch_size, tokens_per_batch=plan.tokens_per_batch, chunk_size=plan.chunk_size,
                  progress=not request.output.no_progress, mesh=mesh, resources=res.resources, **res.score_options)
    if isinstance(ds, StreamDataset):  # a window of texts at a time, into shards; no record is held
        records = None
        cols = shards.score_stream(loaded, ds.stream, ds.scan, methods, window=ds.window, out_dir=out, resume=resume,
                                   report=passes.setdefault("main", {}), nonfinite_reason=runner.NONFINITE, **common)
    else:
        records = runner.score_dataset(loaded, ds.texts, methods, ref=ref, neighbors=generator, labels=ds.labels,
                                       out_dir=out, resume=resume, report=passes, pass_options=res.pass_options,
                                       **common)
        cols = shards.columns_of(records, methods, runner.NONFINITE)
    seconds = time.perf_counter() - t0
    n_tokens = cols.n_tokens
    meta = _run_meta(request, ds, loaded, ref, generator, methods, mesh, res, records, cols)
    meta.update(passes=passes, compile=_compile_meta(compiled.stop()),
                packing={"slots": sum(p.get("slots", 0) for p in passes.values()),
                         "tokens": sum(p.get("tokens", 0) for p in passes.values())},
                seconds=round(seconds, 2), tokens_per_second=round(n_tokens / seconds, 1) if seconds > 0 else None)
    counts = _count_lines(meta, loaded.max_length)
    # a labeled eval prints the counts under its table
    _print_scoring(meta, cols.n, n_tokens, seconds, [] if labeled else counts, generator)
    if not processes.is_main_process():  # every process holds all records; process 0 writes the outputs
        return
    if window is not None:
        meta["windows"] = _window_report(request, ds, loaded, records, methods, out)
    if labeled:
        _write_metrics(request, out, ds, loaded, cols, methods, generator, meta, counts, blind_asked, compare,
                       blind_future)
    else:
        (out / "run.json").write_text(json.dumps(meta, indent=2, default=str))
    print(f"wrote {out}/", file=sys.stderr)


def _run_meta(request: ScoreRequest, ds, loaded, ref, generator, methods, mesh, res, records, cols) -> dict:
    """run.json up to its "passes": the command, the configuration, the versions, the device, the models, the data,
    the methods' resources and what the records (``cols``, their ``shards.Columns``; ``records`` themselves for the
    neighbour counts, None when streamed) say: skipped, non-finite, truncated, duplicate texts."""
    dups = ds.duplicates if isinstance(ds, StreamDataset) else data.duplicate_report(ds.texts, ds.labels)
    return {
        "command": " ".join(sys.argv),
        "config": request.config(),
        "methods": methods,
        "package_version": __version__,
        "jax_version": jax.__version__,
        "device": str(jax.devices()[0]),
        "mesh": sharding.mesh_str(mesh) if mesh is not None else None,
        "n_processes": jax.process_count(),
        "platform": platform.platform(),
        "model": {
            "name": loaded.name,
            "source": loaded.source,
            "dtype": loaded.dtype,
            "files": loaded.files,
            "add_bos": loaded.add_bos,
            "max_length": loaded.max_length,
            "first_token_policy": "first token not scored"
            + (" (BOS is prepended, so every text token is scored)" if loaded.add_bos else ""),
        },
        "ref_model": {"name": ref.name, "source": ref.source, "files": ref.files, "add_bos": ref.add_bos}
        if ref
        else None,
        "data": {"name": ds.name, "files": ds.files, "n": len(ds)},
        "method_resources": {"fingerprint": res.fingerprint, "files": res.files} if res.fingerprint else None,
        "neighbors": _neighbor_meta(generator, records) if generator is not None else None,
        "n_skipped": cols.n_skipped,
        "nonfinite_logits": cols.nonfinite,
        "n_truncated": cols.n_truncated,
        "duplicates": dups,
    }


def _print_scoring(meta: dict, n_records: int, n_tokens: int, seconds: float, counts: list[str], generator) -> None:
    """The terminal lines after scoring: texts, tokens and time, the scoring programs and padding, ``counts``
    (:func:`_count_lines`) and the neighbour generator's counts."""
    print(f"scored {n_records - meta['n_skipped']} texts ({n_tokens} tokens) in {seconds:.1f} s; "
          f"skipped {meta['n_skipped']}", file=sys.stderr)
    c, pk = meta["compile"], meta["packing"]
    pad = 1 - pk["tokens"] / pk["slots"] if pk["slots"] else 0.0
    print(f"scoring programs: {c['scoring_programs']} ({c['compiled']} compiled, {c['cache_hits']} from the cache, "
          f"{c['seconds']:.1f} s); padding {pad:.1%} of {pk['slots']} token slots", file=sys.stderr)
    for line in counts:
        print(line, file=sys.stderr)
    if generator is not None:
        nm = meta["neighbors"]
        print(f"neighbor ({generator.name}): {nm['n_neighbors_scored']} neighbours scored, "
              f"{nm['n_identical_neighbors']} identical to their text dropped", file=sys.stderr)


def _write_metrics(request: ScoreRequest, out: Path, ds, loaded, cols, methods, generator, meta: dict,
                   counts: list[str], blind_asked: bool, compare, blind_future: Future | None = None) -> None:
    """A labeled run's metrics: summary.json / .csv / .md with run.json (``report.write_summary``), the ROC plot
    and histograms, and the table, notes and comparisons printed."""
    labels = [int(y) for y in cols.labels]  # a label and a score per method and text: O(N) numbers, no record
    scores, output = cols.scores, request.output
    summary = {m: metrics.evaluate(labels, scores[m], n_bootstrap=output.n_bootstrap, seed=output.seed)
               for m in methods}
    if generator is not None:
        summary["neighbor"]["n_identical_neighbors"] = meta["neighbors"]["n_identical_neighbors"]
    notes = list(counts) + [f"Caveat: {c}." for c in getattr(ds, "caveats", ())]  # data.known's benchmarks
    na = report.na_note({m: summary[m] for m in methods})
    if na:  # every n/a cell of the table says why, in summary.md too
        notes.insert(0, na)
    if blind_asked or not output.no_blind:
        blind_metrics, note = blind_future.result() if blind_future else _blind_baseline(ds, output, blind_asked)
        if blind_metrics is not None:
            meta["blind_baseline"] = blind_metrics
            if blind_asked:
                summary[blind.NAME] = blind_metrics
        notes.append(note)
    comparisons = _paired(scores, labels, compare, output)
    bold, n_compared = _tied_with_best(labels, scores, summary, methods, output)
    if bold:
        notes.append(bold_note(n_compared))
    report.write_summary(out, summary, extra=meta, notes=notes, comparisons=comparisons, bold=bold)
    report.plot_roc(out / "roc.png", {m: (labels, scores[m]) for m in methods}, title=f"{ds.name}, {loaded.name}")
    report.plot_histograms(out / "histograms.png", scores, labels)
    if len(set(labels)) == 2:
        print(report.markdown_table({m: summary[m] for m in methods}, bold))
    else:
        print(f"Text-level metrics not computed: every text has label {labels[0]}"
              + (" (see the window-level table)." if request.methods.options.window is not None else "; eval needs "
                 "members (1) and non-members (0), or use mia-jax score for unlabeled texts."))
    print("".join(f"\n{n}" for n in notes).lstrip("\n"))
    if comparisons:
        print("\n" + report.comparisons_markdown(comparisons))


def _window_report(request: ScoreRequest, ds, loaded, records, methods, out: Path) -> dict:
    """Online detection: window-level metrics (and the blind baseline on the windows' texts, unless --no-blind)
    where the data says where each text's member part begins, each text's first flagged window; windows.csv (text,
    window, tokens, label, scores, window_text) and a printed summary."""
    opts, output = request.methods.options, request.output
    method = opts.window_method or next((m for m in methods if m.startswith("min_k_pp@")), methods[0])
    if method not in methods:
        raise UserError(f"--window-method {method!r} is not one of this run's methods ({', '.join(methods)})")
    starts = ds.extra.get(opts.member_from_field, [None] * len(ds))
    labels = windowed.window_labels(loaded.tokenizer, ds.texts, starts, records)
    texts = windowed.window_texts(loaded, ds.texts, records)  # from the texts: also on a resumed run
    rep = windowed.report(records, labels, methods, method=method, threshold=opts.window_threshold, fpr=0.05,
                          n_bootstrap=output.n_bootstrap if request.labeled else 0, seed=output.seed,
                          texts=texts, blind=not output.no_blind)
    rows = [[i, j, n, lab, *(r["windows"]["scores"][m][j] for m in methods), wt]
            for i, (r, labs, wts) in enumerate(zip(records, labels, texts)) if "windows" in r
            for j, (n, lab, wt) in enumerate(zip(r["windows"]["n_tokens"], labs, wts))]
    report.write_csv(out / "windows.csv", ["text", "window", "n_tokens", "label", *methods, concat.WINDOW_TEXT], rows)
    print(f"windows of {opts.window} tokens: {rep['n_windows']} ({rep['n_labeled']} labeled, {rep['n_straddling']} "
          f"straddling the member boundary or unlabeled); per-window scores in {out / 'windows.csv'}", file=sys.stderr)
    if "metrics" in rep:
        print("Window-level detection (windows pooled over texts):\n" + report.markdown_table(rep["metrics"]))
    if rep.get("blind_note"):
        print(rep["blind_note"])
    if "threshold" in rep:
        flagged = [f for f in rep["first_flagged"] if f is not None]
        print(f"{method} above {rep['threshold']:.4g}"
              f"{' (' + rep['threshold_from'] + ')' if 'threshold_from' in rep else ''}: {len(flagged)} of "
              f"{len(records)} texts have a flagged window; first flagged window per text in run.json")
    return rep


def _count_lines(meta: dict, max_length: int) -> list[str]:
    """What a reader of the table must know about the data: truncation and duplicates (terminal + summary.md)."""
    lines = [f"Truncated to the model's context of {max_length} tokens: {meta['n_truncated']} texts. "
             f"Exact duplicates of an earlier text: {meta['duplicates']['n_duplicate_texts']} texts."]
    warning = report.nonfinite_warning(meta.get("nonfinite_logits") or [])
    if warning:
        lines.append(warning)
    conflicting = meta["duplicates"]["n_conflicting_texts"]
    if conflicting:
        lines.append(f"Warning: {conflicting} distinct texts appear both as member and as non-member "
                     "(label 1 and label 0); no detector can separate them, and they lower every AUROC.")
    return lines

"""What ``mia-jax eval`` and ``mia-jax score`` share: their options (:func:`add_arguments`) and the run itself
(:func:`run`: the arguments made into one :class:`~mia_jax.commands.request.ScoreRequest`; :func:`run_request`: the
request checked, the model and the data loaded and the run folder claimed with the run's fingerprint before
:func:`mia_jax.commands.scoring_report.score_and_report` scores and reports)."""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import jax

from mia_jax.runs import processes
from mia_jax import benchmarks, data
from mia_jax.evaluation import blind
from mia_jax.engine import compilation, sharding
from mia_jax.runs import entry, rundir
from mia_jax.methods import resources
from mia_jax.batching import TOKENS_PER_BATCH, check_tokens_per_batch
from mia_jax.commands import options, scoring_report
from mia_jax.commands.request import ScoreRequest
from mia_jax.errors import UserError
from mia_jax.data import sample, stream
from mia_jax.scorers import DEFAULT_K, DEFAULT_METHODS, expand_methods, is_multi_pass, known_methods

STREAM_WINDOW = 4096  # texts per shard of a streamed run (--stream-window)


def add_arguments(p: argparse.ArgumentParser, labeled: bool) -> None:
    """The options of ``eval`` (``labeled``) and ``score`` on ``p``."""
    options.model(p, dtype=None, tokenizer=True)
    p.add_argument("--ref-model", help="reference model for the 'ref' method (Smaller-Ref); its own tokenizer is used")
    p.add_argument("--neighbor-mlm", metavar="PATH", type=entry.input_dir,
                   help="BERT / RoBERTa masked-LM folder (config.json, *.safetensors, tokenizer.json) that proposes "
                        "the word replacements of the 'neighbor' method (default: the target model proposes them)")
    p.add_argument("--n-neighbors", type=entry.positive_int, default=10,
                   help="neighbours per text for the 'neighbor' method (default: 10; Mattern et al. use 25)")
    p.add_argument("--neighbor-seed", type=entry.nonneg_int, default=0,
                   help="seed of the neighbour generator (default: 0)")
    add_method_options(p)
    options.data(p, labeled=labeled)
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                   help="scorers; a bare min_k / max_k / min_k_pp expands to one method per --k "
                        f"(default: {' '.join(DEFAULT_METHODS)}); registered: {known_methods()}")
    p.add_argument("--k", nargs="+", type=entry.fraction, default=list(DEFAULT_K), help="fractions for Min-K%% methods")
    p.add_argument("--tokens-per-batch", type=entry.positive_int,
                   help="token slots of one scoring step: texts are packed into rows of this budget (default: "
                        f"{TOKENS_PER_BATCH['cpu']} on CPU, {TOKENS_PER_BATCH['gpu']} on GPU and TPU)")
    options.batches(p)
    p.add_argument("--stream-window", type=entry.positive_int, default=STREAM_WINDOW, metavar="N",
                   help="an input of more than N texts is read, scored and written N texts at a time, into numbered "
                        "shards (passes/main/00000.jsonl, ...) that a killed run resumes from; single-pass methods on "
                        f"one process without --window (default: {STREAM_WINDOW})")
    p.add_argument("--compilation-cache", metavar="DIR|off",
                   help="JAX's persistent compilation cache (default: $MIA_JAX_COMPILATION_CACHE or "
                        "~/.cache/mia_jax/jax; 'off' turns it off)")
    options.mesh(p)
    options.run_folder(p, out_help="output folder (default: runs/<data>-<model>); an interrupted run of the same job "
                                   "in it resumes, a different one is refused")


def add_method_options(p: argparse.ArgumentParser) -> None:
    """The options of the methods that need more than the model (:data:`mia_jax.methods.resources.NEEDS`) on ``p``."""
    resources.add_arguments(p)


# Every option of `eval` / `score` either goes into the run's fingerprint (`fingerprint`) or is listed here with the
# reason it cannot change a record; tests check that no option is in neither.
NOT_IN_FINGERPRINT = {
    "command": "eval and score write different records: `labeled` is in the fingerprint",
    "model": "identified by its files' SHA-256 (model_files): a name and a path to the same files agree",
    "tokenizer": "its file is among model_files",
    "ref_model": "identified by its files' SHA-256 (ref_model_files)",
    "allow_download": "only how a model is found; the files found are fingerprinted",
    "neighbor_mlm": "part of the neighbour generator's config (neighbors)",
    "n_neighbors": "part of the neighbour generator's config (neighbors)",
    "neighbor_seed": "part of the neighbour generator's config (neighbors)",
    "data": "a path: the file is fingerprinted by resolved path and SHA-256 (data_files), its texts (texts_sha256)",
    "benchmark": "chooses the data files (data_files) and texts (texts_sha256)",
    **{dest: "chooses the data files (data_files) and texts (texts_sha256)"
       for dest in [*benchmarks.option_dests(), "data_dir"]},
    "k": "expanded into the method names (methods)",
    "distributed": "how the processes start; the mesh they form is in the fingerprint",
    "n_bootstrap": "metrics only: recomputed from the records at the end of every run, resumed or not",
    "seed": "metrics and blind baseline only: recomputed from the records at the end of every run",
    "no_blind": "metrics only: the blind baseline never reads or writes a record",
    "compare": "metrics only: paired comparisons are computed from the records at the end of every run",
    "out": "the folder itself",
    "overwrite": "decides what happens to the folder, not what a record holds",
    "no_progress": "display only",
    "compilation_cache": "where compiled programs are kept: the same program either way",
    "stream_window": "in the fingerprint of a streamed run (stream_window); a run of one window does not use it",
    **resources.not_in_fingerprint(),  # the options of add_method_options
}


def load_data(request: ScoreRequest):
    """The ``mia_jax.data.Dataset`` the request's data names (--data, --benchmark), cut to --limit texts
    (``data.sample.limit_rows``: labeled data keeps both classes; how, said on stderr)."""
    d, opts = request.data, request.methods.options
    if request.labeled and not d.data:
        shared = {"data_dir": d.data_dir, "window": opts.window, "member_from_field": opts.member_from_field}
        ds = benchmarks.load(d.benchmark or benchmarks.DEFAULT, benchmarks.loader_options(d.benchmark_options,
                                                                                           **shared))
    else:
        extra = (opts.member_from_field,) if opts.window is not None else ()
        ds = data.load(d.data, d.data_dir, d.text_field, d.label_field if request.labeled else None,
                       encoding=d.encoding, extra=extra)
    rows = sample.limit_rows(ds.labels, len(ds.texts), d.limit)
    if rows is not None:
        ds.limit_note = sample.describe_limit(ds.labels, d.limit, len(ds.texts))  # said once the run is claimed
        ds.texts = [ds.texts[i] for i in rows]
        ds.labels = [ds.labels[i] for i in rows] if ds.labels is not None else None
        ds.extra = {k: [v[i] for i in rows] for k, v in ds.extra.items()}
    return ds


def open_stream(request: ScoreRequest, methods) -> stream.StreamDataset | data.Dataset | None:
    """The ``--data`` input read by its streaming first pass (counts, fingerprint digest, labels, duplicates) when
    this run may stream it (single-pass methods only, no ``--window``; on one process or several): a
    :class:`~mia_jax.data.stream.StreamDataset` when it has more than ``--stream-window`` texts (after ``--limit``),
    else the ``data.Dataset`` of the texts that pass kept (the input is read once). None otherwise (``load_data``)."""
    d = request.data
    if not d.data or request.methods.options.window is not None or any(is_multi_pass(m) for m in methods):
        return None
    texts = stream.TextStream(d.data, d.text_field, d.label_field if request.labeled else None,
                              encoding=d.encoding, limit=d.limit, data_dir=d.data_dir)
    note = texts.apply_limit()
    scan = texts.scan(keep=d.stream_window)
    ds = stream.StreamDataset(texts, scan, d.stream_window) if scan.texts is None else texts.dataset(scan)
    ds.limit_note = note  # said once the run is claimed
    return ds


def held_because(methods) -> str:
    """Why a run of more than --stream-window texts is not streamed (``open_stream``'s conditions), for its note."""
    multi = [m for m in methods if is_multi_pass(m)]
    if multi:
        return f"multi-pass methods ({', '.join(multi)})"
    return "--window runs"


def fingerprint(request: ScoreRequest, ds, loaded, ref, generator, methods, mesh, res) -> dict:
    """What makes a run: every input that can change a record (see NOT_IN_FINGERPRINT for the rest). ``request``:
    resolved (its dtype and tokens per batch); ``res``: the run's ``resources.Resources``; the rest as :func:`run`
    makes them."""
    from mia_jax.engine import runner  # here, not at the top: it loads the model code (start-up time)

    d, plan, labeled = request.data, request.plan, request.labeled
    streamed = isinstance(ds, stream.StreamDataset)
    extra = {"stream_window": ds.window, "texts_digest": (ds.scan.texts_sha256, ds.scan.n)} if streamed else {}
    return runner.run_fingerprint(
        loaded, ds.texts, ds.labels, methods, ref=ref, neighbors=generator, data_files=ds.files, labeled=labeled,
        encoding=d.encoding, text_field=ds.text_field or d.text_field,
        label_field=d.label_field if labeled else None,
        limit=d.limit, batch_size=plan.batch_size, tokens_per_batch=plan.tokens_per_batch,
        chunk_size=plan.chunk_size, dtype=request.model.dtype,
        mesh=sharding.mesh_str(mesh) if mesh is not None else None, **res.fingerprint, **extra)


def neighbor_generator(request: ScoreRequest, loaded):
    """The 'neighbor' method's generator: the --neighbor-mlm masked LM, else the target model ``loaded`` itself."""
    from mia_jax.methods import neighbors  # here, not at the top: it loads the model code (start-up time)

    m = request.methods
    if request.model.neighbor_mlm:
        return neighbors.MLMNeighbors(request.model.neighbor_mlm, n=m.n_neighbors, seed=m.neighbor_seed,
                                      dtype=request.model.dtype)
    return neighbors.SelfNeighbors(loaded, n=m.n_neighbors, seed=m.neighbor_seed,
                                   batch_size=request.plan.batch_size)


def run(args, labeled: bool) -> Path:
    """``mia-jax eval`` (``labeled``) or ``score``: the parsed ``args`` made into the run's request
    (:meth:`ScoreRequest.from_args`, the only reader of ``args``), then :func:`run_request`."""
    request = ScoreRequest.from_args(args)
    if request.labeled != labeled:
        raise ValueError(f"scoring.run(labeled={labeled}) of a {request.command!r} command line")
    return run_request(request)


def run_request(request: ScoreRequest) -> Path:
    """``mia-jax eval`` (``request.labeled``) or ``score``: check the request, load the data and the models, claim
    the run folder and score and report into it; returns the folder."""
    from mia_jax import models  # here, not at the top: they load the model code (start-up time)
    from mia_jax.engine import runner

    labeled, d, m = request.labeled, request.data, request.model
    processes.initialize_distributed(request.plan.distributed)  # before anything touches a device
    if request.output.out:
        entry.check_out(request.output.out)
    check_tokens_per_batch(request.plan.tokens_per_batch)
    asked = request.methods.methods
    blind_asked = blind.NAME in asked
    methods = expand_methods([x for x in asked if x != blind.NAME], list(request.methods.k))  # before loading
    if not methods:
        raise UserError(f"give at least one model-based method besides {blind.NAME} (which is reported with any "
                        "labeled eval anyway)")
    if blind_asked and not labeled:
        raise UserError(f"{blind.NAME} needs labels: use mia-jax eval")
    compare = comparisons(request, methods) if labeled else []
    ds = open_stream(request, methods) or load_data(request)
    if "ref" in methods and not m.ref_model:
        raise UserError("method 'ref' needs a reference model: add --ref-model PATH_OR_NAME")
    mesh = sharding.make_mesh(request.plan.mesh) if request.plan.mesh or jax.process_count() > 1 else None
    if jax.process_count() > 1 and "neighbor" in methods:
        raise UserError("the 'neighbor' method is not supported on several processes yet; run it on one host")
    compilation.enable(request.plan.compilation_cache)
    request = request.resolved(dtype=runner.default_dtype(), tokens_per_batch=runner.default_tokens_per_batch())
    m = request.model
    load = models.load if mesh is None else (lambda name, **kw: sharding.load_sharded(name, mesh, **kw))  # noqa: E731
    model_loaded = threading.Event()  # the baseline's metrics and matplotlib's import wait for it: both need the GIL
    blind_future = scoring_report.start_blind_baseline(request.output, ds, labeled, blind_asked, model_loaded)
    try:
        loaded = load(m.model, dtype=m.dtype, tokenizer_path=m.tokenizer, allow_download=m.allow_download)
        ref = (load(m.ref_model, dtype=m.dtype, allow_download=m.allow_download)
               if m.ref_model and "ref" in methods else None)
    finally:
        model_loaded.set()
    generator = neighbor_generator(request, loaded) if "neighbor" in methods else None
    res = resources.build(request.methods.options, methods, ds.texts if ds.texts is not None else [], loaded)
    out = entry.check_out(request.output.out or f"runs/{ds.name}-{loaded.name}")
    inputs = [d.data, d.data_dir, m.model, m.tokenizer, m.ref_model, m.neighbor_mlm, loaded.source, *loaded.files,
              *(ref.files if ref else ()), *ds.files, *res.files]  # what --overwrite must never delete
    with rundir.claim(out, fingerprint(request, ds, loaded, ref, generator, methods, mesh, res),
                      overwrite=request.output.overwrite, inputs=inputs) as resume:
        if resume:
            print(f"resuming the run in {out}", file=sys.stderr)
        if getattr(ds, "limit_note", ""):  # after the checks: an error is never a second line
            print(f"note: {ds.limit_note}", file=sys.stderr)
        if d.data and ds.texts is not None and len(ds) > d.stream_window:  # after the checks: never 2 lines
            print(f"note: {len(ds)} texts held in memory, not streamed (--stream-window {d.stream_window}): "
                  f"{held_because(methods)} take the in-memory path", file=sys.stderr)
        scoring_report.score_and_report(request, out, resume, ds, loaded, ref, generator, methods, mesh,
                                        blind_asked, compare, res, blind_future)
    return out


def comparisons(request: ScoreRequest, methods: list[str]) -> list[tuple[str, str]]:
    """The (A, B) pairs of --compare as names among this run's ``methods``, checked before anything is loaded or
    written (a UserError names a pair that is not)."""
    pairs = []
    for pair in request.methods.compare:
        names = []
        for name in pair:
            try:
                expanded = expand_methods([name], list(request.methods.k))
            except UserError:
                expanded = [name]
            if len(expanded) != 1 or expanded[0] not in methods:
                raise UserError(f"--compare {' '.join(pair)}: {name!r} is not one of this run's methods "
                                f"({', '.join(methods)})")
            names.append(expanded[0])
        if names[0] == names[1]:
            raise UserError(f"--compare {' '.join(pair)}: compares a method with itself")
        pairs.append((names[0], names[1]))
    if pairs and request.output.n_bootstrap < 1:
        raise UserError(f"--compare needs --n-bootstrap of at least 1, got {request.output.n_bootstrap}")
    return pairs

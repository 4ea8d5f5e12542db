"""What ``mia-jax eval`` and ``mia-jax score`` share: their options (:func:`add_arguments`) and the run itself
(:func:`run`: every argument checked, the model and the data loaded and the run folder claimed with the run's
fingerprint before :func:`mia_jax.commands.scoring_report.score_and_report` scores and reports)."""
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


def load_data(args, labeled: bool):
    """The ``mia_jax.data.Dataset`` the arguments name (--data, --benchmark), cut to --limit texts
    (``data.sample.limit_rows``: labeled data keeps both classes; how, said on stderr)."""
    if labeled and not args.data:
        ds = benchmarks.load(args.benchmark or benchmarks.DEFAULT, args)
    else:
        extra = (args.member_from_field,) if args.window is not None else ()
        ds = data.load(args.data, args.data_dir, args.text_field, args.label_field if labeled else None,
                       encoding=args.encoding, extra=extra)
    rows = sample.limit_rows(ds.labels, len(ds.texts), args.limit)
    if rows is not None:
        ds.limit_note = sample.describe_limit(ds.labels, args.limit, len(ds.texts))  # said once the run is claimed
        ds.texts = [ds.texts[i] for i in rows]
        ds.labels = [ds.labels[i] for i in rows] if ds.labels is not None else None
        ds.extra = {k: [v[i] for i in rows] for k, v in ds.extra.items()}
    return ds


def open_stream(args, labeled: bool, methods) -> stream.StreamDataset | data.Dataset | None:
    """The ``--data`` input read by its streaming first pass (counts, fingerprint digest, labels, duplicates) when
    this run may stream it (single-pass methods only, no ``--window``; on one process or several): a
    :class:`~mia_jax.data.stream.StreamDataset` when it has more than ``--stream-window`` texts (after ``--limit``),
    else the ``data.Dataset`` of the texts that pass kept (the input is read once). None otherwise (``load_data``)."""
    if not args.data or getattr(args, "window", None) is not None or any(is_multi_pass(m) for m in methods):
        return None
    texts = stream.TextStream(args.data, args.text_field, args.label_field if labeled else None,
                              encoding=args.encoding, limit=args.limit, data_dir=getattr(args, "data_dir", None))
    note = texts.apply_limit()
    scan = texts.scan(keep=args.stream_window)
    ds = stream.StreamDataset(texts, scan, args.stream_window) if scan.texts is None else texts.dataset(scan)
    ds.limit_note = note  # said once the run is claimed
    return ds


def held_because(args, methods) -> str:
    """Why a run of more than --stream-window texts is not streamed (``open_stream``'s conditions), for its note."""
    multi = [m for m in methods if is_multi_pass(m)]
    if multi:
        return f"multi-pass methods ({', '.join(multi)})"
    return "--window runs"


def fingerprint(args, labeled: bool, ds, loaded, ref, generator, methods, mesh, res) -> dict:
    """What makes a run: every input that can change a record (see NOT_IN_FINGERPRINT for the rest). ``res``: the
    run's ``resources.Resources``; the rest as :func:`run` makes them."""
    from mia_jax.engine import runner  # here, not at the top: it loads the model code (start-up time)

    streamed = isinstance(ds, stream.StreamDataset)
    extra = {"stream_window": ds.window, "texts_digest": (ds.scan.texts_sha256, ds.scan.n)} if streamed else {}
    return runner.run_fingerprint(
        loaded, ds.texts, ds.labels, methods, ref=ref, neighbors=generator, data_files=ds.files, labeled=labeled,
        encoding=args.encoding, text_field=ds.text_field or args.text_field,
        label_field=args.label_field if labeled else None,
        limit=args.limit, batch_size=args.batch_size, tokens_per_batch=args.tokens_per_batch,
        chunk_size=args.chunk_size, dtype=args.dtype,
        mesh=sharding.mesh_str(mesh) if mesh is not None else None, **res.fingerprint, **extra)


def neighbor_generator(args, loaded):
    """The 'neighbor' method's generator: the --neighbor-mlm masked LM, else the target model ``loaded`` itself."""
    from mia_jax.methods import neighbors  # here, not at the top: it loads the model code (start-up time)

    if args.neighbor_mlm:
        return neighbors.MLMNeighbors(args.neighbor_mlm, n=args.n_neighbors, seed=args.neighbor_seed,
                                      dtype=args.dtype)
    return neighbors.SelfNeighbors(loaded, n=args.n_neighbors, seed=args.neighbor_seed,
                                   batch_size=args.batch_size)


def run(args, labeled: bool) -> Path:
    """``mia-jax eval`` (``labeled``) or ``score``: check the arguments, load the data and the models, claim the run
    folder and score and report into it; returns the folder."""
    from mia_jax import models  # here, not at the top: they load the model code (start-up time)
    from mia_jax.engine import runner

    processes.initialize_distributed(args.distributed)  # before anything touches a device
    if args.out:
        entry.check_out(args.out)
    check_tokens_per_batch(args.tokens_per_batch)
    blind_asked = blind.NAME in args.methods
    methods = expand_methods([m for m in args.methods if m != blind.NAME], args.k)  # validate before loading
    if not methods:
        raise UserError(f"give at least one model-based method besides {blind.NAME} (which is reported with any "
                        "labeled eval anyway)")
    if blind_asked and not labeled:
        raise UserError(f"{blind.NAME} needs labels: use mia-jax eval")
    compare = comparisons(args, methods) if labeled else []
    ds = open_stream(args, labeled, methods) or load_data(args, labeled)
    if "ref" in methods and not args.ref_model:
        raise UserError("method 'ref' needs a reference model: add --ref-model PATH_OR_NAME")
    mesh = sharding.make_mesh(args.mesh) if args.mesh or jax.process_count() > 1 else None
    if jax.process_count() > 1 and "neighbor" in methods:
        raise UserError("the 'neighbor' method is not supported on several processes yet; run it on one host")
    compilation.enable(args.compilation_cache)
    args.dtype = args.dtype or runner.default_dtype()
    args.tokens_per_batch = args.tokens_per_batch or runner.default_tokens_per_batch()
    load = models.load if mesh is None else (lambda name, **kw: sharding.load_sharded(name, mesh, **kw))  # noqa: E731
    model_loaded = threading.Event()  # the baseline's metrics and matplotlib's import wait for it: both need the GIL
    blind_future = scoring_report.start_blind_baseline(args, ds, labeled, blind_asked, model_loaded)
    try:
        loaded = load(args.model, dtype=args.dtype, tokenizer_path=args.tokenizer, allow_download=args.allow_download)
        ref = (load(args.ref_model, dtype=args.dtype, allow_download=args.allow_download)
               if args.ref_model and "ref" in methods else None)
    finally:
        model_loaded.set()
    generator = neighbor_generator(args, loaded) if "neighbor" in methods else None
    res = resources.build(args, methods, ds.texts if ds.texts is not None else [], loaded)
    out = entry.check_out(args.out or f"runs/{ds.name}-{loaded.name}")
    inputs = [args.data, getattr(args, "data_dir", None), args.model, getattr(args, "tokenizer", None),
              args.ref_model, args.neighbor_mlm, loaded.source, *loaded.files, *(ref.files if ref else ()), *ds.files,
              *res.files]  # what --overwrite must never delete
    with rundir.claim(out, fingerprint(args, labeled, ds, loaded, ref, generator, methods, mesh, res),
                      overwrite=args.overwrite, inputs=inputs) as resume:
        if resume:
            print(f"resuming the run in {out}", file=sys.stderr)
        if getattr(ds, "limit_note", ""):  # after the checks: an error is never a second line
            print(f"note: {ds.limit_note}", file=sys.stderr)
        if args.data and ds.texts is not None and len(ds) > args.stream_window:  # after the checks: never 2 lines
            print(f"note: {len(ds)} texts held in memory, not streamed (--stream-window {args.stream_window}): "
                  f"{held_because(args, methods)} take the in-memory path", file=sys.stderr)
        scoring_report.score_and_report(args, labeled, out, resume, ds, loaded, ref, generator, methods, mesh,
                                        blind_asked, compare, res, blind_future)
    return out


def comparisons(args, methods: list[str]) -> list[tuple[str, str]]:
    """The (A, B) pairs of --compare as names among this run's ``methods``, checked before anything is loaded or
    written (a UserError names a pair that is not)."""
    pairs = []
    for pair in args.compare:
        names = []
        for name in pair:
            try:
                expanded = expand_methods([name], args.k)
            except UserError:
                expanded = [name]
            if len(expanded) != 1 or expanded[0] not in methods:
                raise UserError(f"--compare {' '.join(pair)}: {name!r} is not one of this run's methods "
                                f"({', '.join(methods)})")
            names.append(expanded[0])
        if names[0] == names[1]:
            raise UserError(f"--compare {' '.join(pair)}: compares a method with itself")
        pairs.append((names[0], names[1]))
    if pairs and args.n_bootstrap < 1:
        raise UserError(f"--compare needs --n-bootstrap of at least 1, got {args.n_bootstrap}")
    return pairs

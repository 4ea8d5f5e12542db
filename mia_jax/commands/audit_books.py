"""``mia-jax audit-books``: what share of each book's snippets has a model seen? The options, the audit run
(inputs checked and the model loaded before anything is written; the folder and its scoring runs claimed) and the
``--from`` rebuild. The audit itself: :mod:`mia_jax.audits.books`."""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mia_jax import __version__, models
from mia_jax.runs import entry, rundir
from mia_jax.engine import runner
from mia_jax.audits.books import (FPR, METHODS, N_BOOTSTRAP, RATE_METHOD, SNIPPET_WORDS, SNIPPETS, BooksConfig,
                                  BooksResult, audit_books, books_phrase, check_methods, check_options, prepare)
from mia_jax.audits.books_rebuild import read_info, rebuild
from mia_jax.audits.books_report import REBUILD_READS, render_outputs, to_markdown, write_outputs
from mia_jax.commands.audit_options import (claim_runs, from_option, model_options, out_option, rebuild_command,
                                            resolved)
from mia_jax.commands import options
from mia_jax.commands.options import RESUME
from mia_jax.commands.request import AuditRunRequest, CommandRequest
from mia_jax.errors import UserError

NAME = "audit-books"
HELP = "what share of each book's snippets has a model seen? (Min-K%% contamination rates, Shi et al. 2023 section 5)"
RESUME_HINT = RESUME  # what Ctrl-C tells: the scoring runs keep every finished batch


def add_arguments(p) -> None:
    """The options of ``mia-jax audit-books`` on the argparse parser ``p``."""
    p.add_argument("--books", help="the books to audit: a folder of BOOK.txt files (or of seen/ and unseen/ "
                                   "subfolders), or a .jsonl (or a TFDS dataset tfds:NAME[/CONFIG][:SPLIT] built in "
                                   "--data-dir) with title and text fields")
    p.add_argument("--model", help="a Hugging Face folder, a .gguf file or an offline name")
    from_option(p, "audit-books", "source",
                help="rebuild every output of the audit in DIR (its --out) from DIR/snippets.csv, books.csv and "
                     "info.json (checked against DIR/manifest.json), without the model, into --out (new, empty, "
                     "an earlier rebuild of DIR, or DIR itself); its settings are DIR's (no --books, --model, "
                     "--validation or --threshold)")
    p.add_argument("--validation", help="labeled books that set the thresholds: a .jsonl with title, text and label "
                                        "(1 = seen, 0 = unseen; or such a TFDS dataset), or a folder with seen/ and "
                                        "unseen/ subfolders")
    out_option(p, "books.md, books.csv, snippets.csv, histogram.png, info.json, manifest.json; the scoring runs in "
                  "OUT/books and OUT/validation")
    p.add_argument("--snippets", type=entry.positive_int, default=SNIPPETS,
                   help=f"snippets drawn per book (default {SNIPPETS})")
    p.add_argument("--snippet-words", type=entry.positive_int, default=SNIPPET_WORDS,
                   help=f"words per snippet (default {SNIPPET_WORDS})")
    p.add_argument("--seed", type=entry.nonneg_int, default=0,
                   help="seed of the snippet draw and the bootstrap (default 0)")
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   help=f"methods whose validation AUROC is reported (default: {' '.join(METHODS)})")
    p.add_argument("--method-for-rate", default=RATE_METHOD,
                   help=f"the method whose threshold flags snippets (default {RATE_METHOD})")
    p.add_argument("--fpr", type=entry.nonneg_float, default=FPR,
                   help=f"target validation FPR of the second threshold (default {FPR})")
    p.add_argument("--threshold", type=float,
                   help="a threshold on the rate method's score (higher = seen; min_k@0.2: the mean log-probability "
                        "of the 20%% least likely tokens); required without --validation")
    p.add_argument("--n-bootstrap", type=entry.nonneg_int, default=N_BOOTSTRAP,
                   help="bootstrap resamples of the AUROC intervals")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the books (default: utf-8)")
    options.data_dir(p)
    model_options(p, "OUT/books and OUT/validation")


@dataclass(frozen=True)
class BooksInputs:
    """What is audited: ``--books`` and ``--validation`` (files, folders or ``tfds:`` datasets read from
    ``--data-dir`` with ``--encoding``) and ``--model``."""
    books: str | None
    validation: str | None
    model: str | None
    data_dir: Path | None
    encoding: str


@dataclass(frozen=True)
class BooksSettings:
    """How: the snippets drawn (``--snippets``, ``--snippet-words``, ``--seed``), the methods reported
    (``--methods``) and the one that flags snippets (``--method-for-rate``) at ``--threshold`` and ``--fpr``, and
    the bootstrap of the AUROC intervals (``--n-bootstrap``)."""
    snippets: int
    snippet_words: int
    seed: int
    methods: tuple[str, ...]
    method_for_rate: str
    fpr: float
    threshold: float | None
    n_bootstrap: int


@dataclass(frozen=True)
class BooksRequest(CommandRequest):
    """``mia-jax audit-books`` as asked: an audit (``inputs``, ``settings``, ``run``) into ``--out``, or the rebuild
    of the audit in ``--from`` (``source``)."""
    COMMAND: ClassVar[str] = NAME
    inputs: BooksInputs
    settings: BooksSettings
    run: AuditRunRequest
    source: Path | None
    out: Path


def run(args: argparse.Namespace) -> None:
    """``mia-jax audit-books`` with the parsed ``args`` made into its request (:meth:`BooksRequest.from_args`, the
    only reader of ``args``): ``run_rebuild`` with ``--from``, else ``run_audit``."""
    request = BooksRequest.from_args(args)
    if request.source is not None:
        run_rebuild(request)
    else:
        run_audit(request)


def config_of(request: BooksRequest) -> BooksConfig:
    """The audit's settings from the request (``--methods`` and ``--method-for-rate`` as given)."""
    s, r = request.settings, request.run
    return BooksConfig(snippets=s.snippets, snippet_words=s.snippet_words, seed=s.seed, methods=s.methods,
                       rate_method=s.method_for_rate, fpr=s.fpr, threshold=s.threshold, n_bootstrap=s.n_bootstrap,
                       batch_size=r.batch_size, chunk_size=r.chunk_size, encoding=request.inputs.encoding)


def run_audit(request: BooksRequest) -> BooksResult:
    """The audit of ``request`` (``--books``, ``--model``, ...): every input checked and the model loaded before
    anything is written, then the folder and each scoring run claimed (resumed when the same), the outputs written
    and the report printed. Returns the result."""
    i, r = request.inputs, request.run
    if i.books is None or i.model is None:
        raise UserError("audit-books needs --books and --model (or --from DIR to rebuild an audit's outputs)")
    cfg = config_of(request)
    check_options(cfg)
    methods, rate_method = check_methods(cfg.methods, cfg.rate_method)
    p, vp, files = prepare(i.books, i.validation, cfg, data_dir=i.data_dir)
    skipped = [f"audit-books: {books_phrase(len(pl.skipped), name)} shorter than one snippet ({cfg.snippet_words} "
               f"words) skipped: {', '.join(s['title'] for s in pl.skipped[:10])}"
               f"{' ...' if len(pl.skipped) > 10 else ''}"
               for name, pl in (("", p), ("validation ", vp)) if pl is not None and pl.skipped]
    out = entry.check_out(request.out)
    loaded = models.load(i.model, dtype=r.dtype, allow_download=r.allow_download)
    fingerprint = audit_fingerprint(request, loaded, files, methods, rate_method)
    # the folder is this audit's (or refused untouched); each scoring run is claimed on its own inside it
    inputs = [i.books, i.validation, i.data_dir, i.model, loaded.source, *loaded.files, *files]
    with rundir.claim(out, fingerprint, overwrite=r.overwrite, inputs=inputs), contextlib.ExitStack() as stack:
        for line in skipped:  # once the folder is ours: a refusal stays one line
            print(line, file=sys.stderr)
        run_dirs, resume = _claim_runs(request, stack, out, loaded, {"books": p, "validation": vp}, files, methods)
        res = audit_books(loaded, p.books, vp.books if vp is not None else None, cfg, run_dirs=run_dirs,
                          resume=resume, progress=not r.no_progress)
        res.config["data_files"] = files
        meta = {"command": " ".join(sys.argv), "package_version": __version__,
                "books": str(i.books), "validation": i.validation,
                "model": {"name": loaded.name, "source": loaded.source, "files": loaded.files, "dtype": loaded.dtype,
                          "add_bos": loaded.add_bos, "max_length": loaded.max_length}}
        write_outputs(res, out, meta)
    print(to_markdown(res))
    print(f"wrote {out}/", file=sys.stderr)
    return res


def _claim_runs(request: BooksRequest, stack, out: Path, loaded, plans: dict, files: dict,
                methods: list[str]) -> tuple[dict, dict]:
    """({set: run folder}, {set: resume?}) of the books' and validation books' scoring runs, each claimed in
    ``stack`` with the fingerprint of its texts and options."""
    s, r = request.settings, request.run

    def fingerprint_of(which):
        return runner.run_fingerprint(loaded, [x.text for x in plans[which].snippets], None, methods,
                                      data_files=files, labeled=False, encoding=request.inputs.encoding,
                                      snippets=s.snippets, snippet_words=s.snippet_words, seed=s.seed,
                                      batch_size=r.batch_size, chunk_size=r.chunk_size, dtype=r.dtype)

    names = [which for which, pl in plans.items() if pl is not None]
    return claim_runs(stack, out, names, fingerprint_of, r.overwrite)


# Options of `audit-books` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("source", "out", "overwrite", "no_progress", "allow_download",  # not what is computed
                      "books", "validation", "model", "data_dir",  # by their files' SHA-256 instead
                      "methods", "method_for_rate")  # expanded (methods, rate_method)


def audit_fingerprint(request: BooksRequest, loaded, data_files: dict, methods: list[str], rate_method: str) -> dict:
    """What makes an audit-books folder (``rundir.claim``): the model's (``loaded``) and every book file's
    (``data_files``: {file: sha256}) SHA-256, the expanded ``methods`` and ``rate_method`` and every option of the
    ``request`` that can change a result; a folder holding anything else is refused. Returns the fingerprint dict."""
    options = {k: v for k, v in sorted(request.options().items()) if k not in NOT_IN_FINGERPRINT}
    return {"command": "audit-books", "model_files": resolved(loaded.files), "data_files": resolved(data_files),
            "methods": methods, "rate_method": rate_method, **options, "package_version": __version__}


def run_rebuild(request: BooksRequest) -> BooksResult:
    """``mia-jax audit-books --from DIR --out OUT`` (:func:`audit_options.rebuild_command`): info.json keeps DIR's
    command, model and data files and notes the rebuild. Returns the rebuilt result."""
    i = request.inputs
    settings = {"--books": i.books, "--model": i.model, "--validation": i.validation,
                "--threshold": request.settings.threshold}
    return rebuild_command("audit-books", Path(request.source), request.out, settings, rebuild,
                           lambda source, res: read_info(source), render_outputs, REBUILD_READS, to_markdown)

"""``mia-jax freq-table``: count a reference corpus's token frequencies with a model's tokenizer (DC-PDD's table,
method dc_pdd); the table itself: :mod:`mia_jax.methods.freq`."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from tqdm.auto import tqdm

from mia_jax import __version__, data
from mia_jax.runs import entry
from mia_jax.methods import freq
from mia_jax.commands import options
from mia_jax.commands.options import RESUME
from mia_jax.commands.request import CommandRequest
from mia_jax.errors import UserError

NAME = "freq-table"
HELP = "count a reference corpus's token frequencies with a model's tokenizer (for dc_pdd)"
DESCRIPTION = ("Count how often each token of a model's tokenizer occurs in a reference corpus (the token frequency "
               "table of DC-PDD, method dc_pdd: pass the file to eval / score with --freq-table).")
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax freq-table`` on ``p``."""
    options.model(p, weights=False, tokenizer=True, reads=": its tokenizer counts (the weights are not read)")
    p.add_argument("--corpus", nargs="+", metavar="FILE", type=entry.input_file,
                   help="reference corpus: .jsonl / .csv / .tsv / .parquet file(s) (default: the bundled Pile "
                        "sample, 600 Pile test-split documents)")
    options.text(p, "--corpus")
    p.add_argument("--max-tokens", type=entry.positive_int,
                   help="count only each document's first N tokens (the authors: 1024). Default: every token")
    p.add_argument("--out", required=True, help="the table to write (.npz)")
    options.no_progress(p)


@dataclass(frozen=True)
class FreqTableRequest(CommandRequest):
    """``mia-jax freq-table`` as asked: the tokenizer of ``model`` (or ``tokenizer``) counts the ``corpus`` files
    (None: the bundled sample; their ``text_field`` in ``encoding``), each document's first ``max_tokens``, into the
    table ``out``."""
    COMMAND: ClassVar[str] = NAME
    model: str
    tokenizer: Path | None
    allow_download: bool
    corpus: tuple[Path, ...] | None
    encoding: str
    text_field: str | None
    max_tokens: int | None
    out: str
    no_progress: bool


def run(args: argparse.Namespace) -> freq.FreqTable:
    """``mia-jax freq-table`` with the parsed ``args`` made into its request (:meth:`FreqTableRequest.from_args`,
    the only reader of ``args``), then :func:`run_request`."""
    return run_request(FreqTableRequest.from_args(args))


def run_request(request: FreqTableRequest) -> freq.FreqTable:
    """``mia-jax freq-table`` as ``request`` asks: count the corpus, write the table, print a one-line summary;
    returns the table written."""
    r = request
    if r.max_tokens is not None and r.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {r.max_tokens}")
    out = Path(r.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give the table's file name, e.g. {out / 'freq.npz'}")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist")
    tokenizer, name = freq.load_tokenizer(r.model, r.tokenizer, r.allow_download)
    corpus = [Path(c) for c in r.corpus] if r.corpus else [freq.default_corpus()]
    datasets = [data.load_records(c, r.text_field, None, encoding=r.encoding) for c in corpus]
    vocab = freq.tokenizer_vocab_size(tokenizer)
    counts = np.zeros(vocab, np.int64)
    n_docs = sum(len(ds) for ds in datasets)
    with tqdm(total=n_docs, desc=f"counting tokens ({name})", unit="doc", disable=r.no_progress) as bar:
        for ds in datasets:
            counts += freq.count_tokens(tokenizer, ds.texts, vocab, max_tokens=r.max_tokens, progress=bar.update)
    files = {str(Path(p).resolve()): h for ds in datasets for p, h in ds.files.items()}
    table = freq.FreqTable(counts, freq.tokenizer_sha256(tokenizer), name, files, {
        "n_documents": n_docs, "text_field": datasets[0].text_field, "max_tokens": r.max_tokens,
        "special_tokens": "the tokenizer's defaults (as scored)", "model": r.model,
        "tokenizer_file": str(Path(r.tokenizer).resolve()) if r.tokenizer else None,
        "package_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    table.save(out)
    print(f"freq-table: {n_docs} documents, {table.total} tokens, {table.n_distinct} distinct tokens (of {vocab}) "
          f"counted with the tokenizer of {name} -> {out}", file=sys.stdout)
    return table

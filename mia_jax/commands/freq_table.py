"""``mia-jax freq-table``: count a reference corpus's token frequencies with a model's tokenizer (DC-PDD's table,
method dc_pdd); the table itself: :mod:`mia_jax.methods.freq`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from mia_jax import __version__, data
from mia_jax.runs import entry
from mia_jax.methods import freq
from mia_jax.commands import options
from mia_jax.commands.options import RESUME
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


def run(args) -> freq.FreqTable:
    """``mia-jax freq-table`` with the parsed ``args``: count the corpus, write the table, print a one-line summary;
    returns the table written."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give the table's file name, e.g. {out / 'freq.npz'}")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist")
    tokenizer, name = freq.load_tokenizer(args.model, args.tokenizer, args.allow_download)
    corpus = [Path(c) for c in args.corpus] if args.corpus else [freq.default_corpus()]
    datasets = [data.load_records(c, args.text_field, None, encoding=args.encoding) for c in corpus]
    vocab = freq.tokenizer_vocab_size(tokenizer)
    counts = np.zeros(vocab, np.int64)
    n_docs = sum(len(ds) for ds in datasets)
    with tqdm(total=n_docs, desc=f"counting tokens ({name})", unit="doc", disable=args.no_progress) as bar:
        for ds in datasets:
            counts += freq.count_tokens(tokenizer, ds.texts, vocab, max_tokens=args.max_tokens, progress=bar.update)
    files = {str(Path(p).resolve()): h for ds in datasets for p, h in ds.files.items()}
    table = freq.FreqTable(counts, freq.tokenizer_sha256(tokenizer), name, files, {
        "n_documents": n_docs, "text_field": datasets[0].text_field, "max_tokens": args.max_tokens,
        "special_tokens": "the tokenizer's defaults (as scored)", "model": args.model,
        "tokenizer_file": str(Path(args.tokenizer).resolve()) if args.tokenizer else None,
        "package_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    table.save(out)
    print(f"freq-table: {n_docs} documents, {table.total} tokens, {table.n_distinct} distinct tokens (of {vocab}) "
          f"counted with the tokenizer of {name} -> {out}", file=sys.stdout)
    return table

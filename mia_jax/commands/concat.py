"""``mia-jax concat``: non-member + member concatenations for online detection (``eval --window``), from WikiMIA or
a contamination corpus; the construction itself: :mod:`mia_jax.audits.concat`."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mia_jax.runs import entry
from mia_jax.audits.concat import PAPER_LENGTHS, check_out_file, contamination_concat, wikimia_concat, write_jsonl
from mia_jax.commands.options import RESUME
from mia_jax.commands.request import CommandRequest
from mia_jax.errors import UserError

NAME = "concat"
HELP = ("non-member + member concatenations for online detection (eval --window): WikiMIA-concat or a contamination "
        "corpus")
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax concat`` on ``p``."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--wikimia", action="store_true", help="WikiMIA-concat (Min-K%%++ section 4.4)")
    src.add_argument("--corpus", metavar="EVAL.jsonl", type=entry.input_file,
                     help="a contamination run's corpus/eval.jsonl (per dataset)")
    p.add_argument("--out", required=True, help="the JSONL file to write (not a folder)")
    p.add_argument("--lengths", nargs="+", type=entry.positive_int,
                   help="part lengths in words, drawn per part (default: 32 64 128 for --wikimia, whole texts for "
                        "--corpus)")
    p.add_argument("--per-side", nargs=2, type=entry.positive_int, default=[1, 1], metavar=("NONMEMBER", "MEMBER"),
                   help="texts per record on each side (default: 1 1)")
    p.add_argument("--n", type=entry.positive_int,
                   help="records (per dataset with --corpus; default: as many as the texts allow)")
    p.add_argument("--controls", type=entry.nonneg_int, default=0,
                   help="extra records of non-member text only (default: 0)")
    p.add_argument("--seed", type=entry.nonneg_int, default=0)


@dataclass(frozen=True)
class ConcatRequest(CommandRequest):
    """``mia-jax concat`` as asked: WikiMIA-concat (``wikimia``) or the concatenations of a contamination ``corpus``
    (``per_side`` texts a side, parts of ``lengths`` words), ``n`` records and ``controls`` drawn with ``seed``,
    written to ``out``."""
    COMMAND: ClassVar[str] = NAME
    wikimia: bool
    corpus: Path | None
    out: str
    lengths: tuple[int, ...] | None
    per_side: tuple[int, int]
    n: int | None
    controls: int
    seed: int


def run(args: argparse.Namespace) -> None:
    """``mia-jax concat`` with the parsed ``args`` made into its request (:meth:`ConcatRequest.from_args`, the only
    reader of ``args``), then :func:`run_request`."""
    run_request(ConcatRequest.from_args(args))


def run_request(request: ConcatRequest) -> None:
    """``mia-jax concat`` as ``request`` asks: every input checked (an --out that is a folder refused) before the
    records are written to --out."""
    r = request
    lengths = list(r.lengths) if r.lengths else None  # a list, as parsed: the refusals quote it
    check_out_file(r.out)
    kw = dict(n_texts=r.n, n_controls=r.controls, seed=r.seed)
    if r.wikimia:
        if r.per_side != (1, 1):
            raise UserError("--per-side: WikiMIA-concat has one text per side (use --corpus for more)")
        ds = wikimia_concat(lengths or PAPER_LENGTHS, **kw)
        records = [{"text": t, "label": y, **{k: v[i] for k, v in ds.extra.items()}}
                   for i, (t, y) in enumerate(zip(ds.texts, ds.labels))]
    else:
        records = contamination_concat(r.corpus, per_side=r.per_side, lengths=lengths, **kw)
    path = write_jsonl(records, r.out)
    print(f"wrote {len(records)} records to {path}; next: mia-jax eval --data {path} --window 32 --model M")

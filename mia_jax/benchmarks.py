"""The benchmarks of ``mia-jax eval --benchmark``, one registry (:data:`BENCHMARKS`): for each, its own options,
its loader and what ``--benchmark``'s help says of it. ``mia_jax.commands.options.data`` makes ``--benchmark``'s
choices and every benchmark's options from it; ``mia_jax.commands.scoring.load_data`` calls the loader.

A benchmark's options are optional (``--data`` excludes ``--benchmark``) and choose its data files and texts
(the folder they are read from is the shared ``--data-dir``, ``args.data_dir``),
which are fingerprinted themselves: they are not in a run's fingerprint as given. Adding a benchmark: a reader
returning a :class:`mia_jax.data.Dataset` (in ``mia_jax/data/`` when it reads files) and its :class:`Benchmark`
entry here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from mia_jax import data
from mia_jax.runs import entry
from mia_jax.audits import concat
from mia_jax.data import known
from mia_jax.errors import UserError

DEFAULT = "wikimia"  # what a labeled run reads with neither --data nor --benchmark


def no_options(p: argparse.ArgumentParser) -> None:
    """A benchmark without options of its own: adds nothing to ``p``."""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``load(args)`` -> its :class:`mia_jax.data.Dataset` (a UserError when the arguments do not
    allow it), ``add_arguments(p)`` its own options on ``p``, ``notes`` what ``--benchmark``'s help says of it
    ('' nothing)."""

    name: str
    load: Callable[[argparse.Namespace], data.Dataset]
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_options
    notes: str = ""


def wikimia_options(p: argparse.ArgumentParser) -> None:
    """``--length`` on ``p`` (None when not given: each benchmark has its default)."""
    p.add_argument("--length", type=entry.positive_int,
                   help="text length: WikiMIA and WikiMIA-24 32, 64, 128 or 256, WikiMIA-25 32, 64 or 128 (default "
                        "32; wikimia-concat draws 32, 64, 128); OLMoMIA the L of its files (default: the one there is)")


def load_wikimia(args) -> data.Dataset:
    """WikiMIA's split of ``args.length`` words (default 32)."""
    return data.wikimia(args.length or 32)


def load_wikimia_concat(args) -> data.Dataset:
    """WikiMIA-concat (``mia_jax.audits.concat``), its ``member_from`` offsets under ``args.member_from_field``;
    it needs ``args.window``."""
    if args.window is None:
        raise UserError("--benchmark wikimia-concat is evaluated per window: add --window 32 (the paper's)")
    ds = concat.wikimia_concat()
    ds.extra = {args.member_from_field: ds.extra["member_from"]}
    return ds


def mimir_options(p: argparse.ArgumentParser) -> None:
    """``--domain`` and ``--split`` on ``p`` (its folder is the shared ``--data-dir``,
    :func:`mia_jax.commands.options.data_dir`)."""
    p.add_argument("--domain", default="wikipedia_en", help="MIMIR domain (arxiv, github, pile_cc, ...)")
    p.add_argument("--split", default=known.MIMIR_SPLIT, choices=known.MIMIR_SPLITS,
                   help=f"MIMIR split: n-gram size and overlap threshold of its non-members (default "
                        f"{known.MIMIR_SPLIT}; the SoK of Meeus et al. advises ngram_13_0.8)")


def load_mimir(args) -> data.Dataset:
    """MIMIR's ``args.domain`` and ``args.split`` from ``args.data_dir`` (default: see ``known.mimir``)."""
    return known.mimir(args.domain, args.split, args.data_dir)


def load_wikimia_24(args) -> data.Dataset:
    """WikiMIA-24's split of ``args.length`` words (default 32) from ``args.data_dir``."""
    return known.wikimia_new("wikimia-24", args.length or 32, args.data_dir)


def load_wikimia_25(args) -> data.Dataset:
    """WikiMIA-25's split of ``args.length`` words (default 32) from ``args.data_dir``."""
    return known.wikimia_new("wikimia-25", args.length or 32, args.data_dir)


def olmomia_options(p: argparse.ArgumentParser) -> None:
    """``--difficulty`` on ``p``: OLMoMIA's setting."""
    p.add_argument("--difficulty", default="random", choices=known.OLMOMIA_SETTINGS,
                   help="OLMoMIA setting: random (the length-filtered pool) or easy / medium / hard (the clustered "
                        "files: less and less distance between members and non-members). Default: random")


def load_olmomia(args) -> data.Dataset:
    """OLMoMIA's ``args.difficulty`` file (of max length ``args.length`` when given) from ``args.data_dir``."""
    return known.olmomia(args.difficulty, args.length, args.data_dir)


# in the order of --benchmark's choices and of their options in the help
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("wikimia", load_wikimia, wikimia_options),
    Benchmark("wikimia-concat", load_wikimia_concat, notes="Min-K%++ section 4.4, non-member + member WikiMIA texts "
                                                           "of 32 / 64 / 128 words, scored per --window"),
    Benchmark("mimir", load_mimir, mimir_options),
    Benchmark("wikimia-24", load_wikimia_24, notes="WikiMIA-24 (Parquet from --data-dir), non-members from March "
                                                   "2024 on"),
    Benchmark("wikimia-25", load_wikimia_25, notes="WikiMIA-25 (Parquet from --data-dir)"),
    Benchmark("olmomia", load_olmomia, olmomia_options, notes="OLMoMIA (JSONL from --data-dir), for the OLMo-7B "
                                                              "checkpoints of steps 100k-400k"),
)}


def choice_help() -> str:
    """``--benchmark``'s help (argparse's ``%`` escaped): the default and each benchmark's notes."""
    notes = "".join(f"; {b.name}: {b.notes}" for b in BENCHMARKS.values() if b.notes)
    return f"a benchmark (default: {DEFAULT}{notes})".replace("%", "%%")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every benchmark's own options on ``p``, in the registry's order."""
    for b in BENCHMARKS.values():
        b.add_arguments(p)


def option_dests() -> list[str]:
    """The destinations (``args`` attributes) of every benchmark's own options."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return list(vars(p.parse_args([])))


def load(name: str, args) -> data.Dataset:
    """The dataset of the benchmark ``name`` (one of :data:`BENCHMARKS`) for the parsed ``args``."""
    return BENCHMARKS[name].load(args)

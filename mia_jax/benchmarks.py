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

from mia_jax import data, entry
from mia_jax.audits import concat
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
    """``--length`` on ``p``."""
    p.add_argument("--length", type=entry.positive_int, default=32,
                   help="WikiMIA text length: 32, 64, 128 or 256 (wikimia-concat draws 32, 64, 128)")


def load_wikimia(args) -> data.Dataset:
    """WikiMIA's split of ``args.length`` words."""
    return data.wikimia(args.length)


def load_wikimia_concat(args) -> data.Dataset:
    """WikiMIA-concat (``mia_jax.audits.concat``), its ``member_from`` offsets under ``args.member_from_field``;
    it needs ``args.window``."""
    if args.window is None:
        raise UserError("--benchmark wikimia-concat is evaluated per window: add --window 32 (the paper's)")
    ds = concat.wikimia_concat()
    ds.extra = {args.member_from_field: ds.extra["member_from"]}
    return ds


def mimir_options(p: argparse.ArgumentParser) -> None:
    """``--domain`` on ``p`` (its folder is the shared ``--data-dir``, :func:`mia_jax.commands.options.data_dir`)."""
    p.add_argument("--domain", default="wikipedia_en", help="MIMIR domain (arxiv, github, pile_cc, ...)")


def load_mimir(args) -> data.Dataset:
    """MIMIR's ``args.domain`` from ``args.data_dir`` (default: ``data.mimir_root``)."""
    return data.mimir(args.domain, args.data_dir)


# in the order of --benchmark's choices and of their options in the help
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("wikimia", load_wikimia, wikimia_options),
    Benchmark("wikimia-concat", load_wikimia_concat, notes="Min-K%++ section 4.4, non-member + member WikiMIA texts "
                                                           "of 32 / 64 / 128 words, scored per --window"),
    Benchmark("mimir", load_mimir, mimir_options),
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

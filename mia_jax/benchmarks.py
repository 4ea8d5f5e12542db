"""The benchmarks of ``mia-jax eval --benchmark``, one registry (:data:`BENCHMARKS`): for each, its own options,
its loader and what ``--benchmark``'s help says of it. ``mia_jax.commands.options.data`` makes ``--benchmark``'s
choices and every benchmark's options from it; ``mia_jax.commands.scoring.load_data`` calls the loader.

A benchmark's options are optional (``--data`` excludes ``--benchmark``) and choose its data files and texts
(the folder they are read from is the shared ``--data-dir``, ``options.data_dir``),
which are fingerprinted themselves: they are not in a run's fingerprint as given. A loader receives them as one
frozen :class:`~mia_jax.runs.options.Options` (:func:`loader_options`: every benchmark's own options and the run's
:data:`SHARED` ones), read as ``options.<dest>``. Adding a benchmark: a reader
returning a :class:`mia_jax.data.Dataset` (in ``mia_jax/data/`` when it reads files) and its :class:`Benchmark`
entry here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from mia_jax import data
from mia_jax.runs import entry
from mia_jax.runs.options import Options, dests_of
from mia_jax.audits import concat
from mia_jax.data import known
from mia_jax.errors import UserError

DEFAULT = "wikimia"  # what a labeled run reads with neither --data nor --benchmark
# the run's options a loader may read besides the benchmarks' own: the data folder, and the window of an online
# detection (wikimia-concat) with the field its member offsets go under
SHARED = ("data_dir", "window", "member_from_field")


def no_options(p: argparse.ArgumentParser) -> None:
    """A benchmark without options of its own: adds nothing to ``p``."""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``load(options)`` -> its :class:`mia_jax.data.Dataset` (``options``: :func:`loader_options`;
    a UserError when the options do not allow it), ``add_arguments(p)`` its own options on ``p``, ``notes`` what
    ``--benchmark``'s help says of it ('' nothing)."""

    name: str
    load: Callable[[Options], data.Dataset]
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_options
    notes: str = ""


def wikimia_options(p: argparse.ArgumentParser) -> None:
    """``--length`` on ``p`` (None when not given: each benchmark has its default)."""
    p.add_argument("--length", type=entry.positive_int,
                   help="text length: WikiMIA and WikiMIA-24 32, 64, 128 or 256, WikiMIA-25 32, 64 or 128 (default "
                        "32; wikimia-concat draws 32, 64, 128); OLMoMIA the L of its files (default: the one there is)")


def load_wikimia(options: Options) -> data.Dataset:
    """WikiMIA's split of ``options.length`` words (default 32)."""
    return data.wikimia(options.length or 32)


def load_wikimia_concat(options: Options) -> data.Dataset:
    """WikiMIA-concat (``mia_jax.audits.concat``), its ``member_from`` offsets under ``options.member_from_field``;
    it needs ``options.window``."""
    if options.window is None:
        raise UserError("--benchmark wikimia-concat is evaluated per window: add --window 32 (the paper's)")
    ds = concat.wikimia_concat()
    ds.extra = {options.member_from_field: ds.extra["member_from"]}
    return ds


def mimir_options(p: argparse.ArgumentParser) -> None:
    """``--domain`` and ``--split`` on ``p`` (its folder is the shared ``--data-dir``,
    :func:`mia_jax.commands.options.data_dir`)."""
    p.add_argument("--domain", default="wikipedia_en", help="MIMIR domain (arxiv, github, pile_cc, ...)")
    p.add_argument("--split", default=known.MIMIR_SPLIT, choices=known.MIMIR_SPLITS,
                   help=f"MIMIR split: n-gram size and overlap threshold of its non-members (default "
                        f"{known.MIMIR_SPLIT}; the SoK of Meeus et al. advises ngram_13_0.8)")


def load_mimir(options: Options) -> data.Dataset:
    """MIMIR's ``options.domain`` and ``options.split`` from ``options.data_dir`` (default: see ``known.mimir``)."""
    return known.mimir(options.domain, options.split, options.data_dir)


def load_wikimia_24(options: Options) -> data.Dataset:
    """WikiMIA-24's split of ``options.length`` words (default 32) from ``options.data_dir``."""
    return known.wikimia_new("wikimia-24", options.length or 32, options.data_dir)


def load_wikimia_25(options: Options) -> data.Dataset:
    """WikiMIA-25's split of ``options.length`` words (default 32) from ``options.data_dir``."""
    return known.wikimia_new("wikimia-25", options.length or 32, options.data_dir)


def olmomia_options(p: argparse.ArgumentParser) -> None:
    """``--difficulty`` on ``p``: OLMoMIA's setting."""
    p.add_argument("--difficulty", default="random", choices=known.OLMOMIA_SETTINGS,
                   help="OLMoMIA setting: random (the length-filtered pool) or easy / medium / hard (the clustered "
                        "files: less and less distance between members and non-members). Default: random")


def load_olmomia(options: Options) -> data.Dataset:
    """OLMoMIA's ``options.difficulty`` file (of max length ``options.length`` when given) from ``options.data_dir``."""
    return known.olmomia(options.difficulty, options.length, options.data_dir)


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
    """The destinations (``Namespace`` attributes) of every benchmark's own options."""
    return list(dests_of(add_arguments))


def loader_options(own: Options, **shared) -> Options:
    """What a loader receives: every benchmark's ``own`` options (``Options.of(given, option_dests())``) with the
    run's :data:`SHARED` options ``shared`` (each of them given)."""
    if set(shared) != set(SHARED):
        raise TypeError(f"loader_options takes the shared options {', '.join(SHARED)}, got {', '.join(shared)}")
    return own.with_values(**shared)


def load(name: str, options: Options) -> data.Dataset:
    """The dataset of the benchmark ``name`` (one of :data:`BENCHMARKS`) for its ``options``
    (:func:`loader_options`)."""
    return BENCHMARKS[name].load(options)

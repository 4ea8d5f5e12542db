"""The contamination ablations, one registry: for each, how its runs are planned from a config and named (their
sub-folders of the sweep's ``--out``), the run.json fields its table reads, its table or figure, and its part of the
study's report with the paper's claims it tests. ``python train/contaminate.py --ablation NAME`` runs one,
``python -m train.tables --from DIR`` rebuilds its table, ``python -m train.study --NAME DIR`` reports on it.

A sweep records its ablation in its fingerprint (``config.json``: ``"ablation"``, sealed in its manifest.json);
the committed sweeps under results/contamination/, made before that record, are known by their runs' sub-folder
names (:func:`sweep_kind`, the one place that falls back to them).
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mia_jax.runs import rundir
from train import claims, sweep_tables, traps_tables
from train.config import ExperimentConfig

_NUMBER = (int, float)


@dataclass(frozen=True)
class Ablation:
    """One ablation: ``plan`` (config -> [(sub-folder, run config)]), ``folders`` (its sub-folders as messages name
    them), ``prefix`` (the sub-folder prefix its runs share: the kind of a sweep that does not record it),
    ``fields`` ([(dotted run.json key, type)] its table reads), ``occurrences`` (its table needs each example's
    occurrence count), ``table`` ((runs' results, methods) -> (markdown, {file: content})) and ``study`` ((runs,
    rebuilt files, tag) -> (report parts, claims))."""

    name: str
    plan: Callable[[ExperimentConfig], list[tuple[str, ExperimentConfig]]]
    folders: str
    prefix: str
    fields: tuple[tuple[str, type | tuple], ...]
    occurrences: bool
    table: Callable
    study: Callable


def with_changes(cfg: ExperimentConfig, **changes) -> ExperimentConfig:
    """A copy of ``cfg`` with changes named by path, ``train__lr=1e-5`` for ``train.lr``."""
    cfg = copy.deepcopy(cfg)
    for key, value in changes.items():
        *path, last = key.split("__")
        node = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def _plan_lr(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [(f"lr_{lr:g}", with_changes(cfg, train__lr=float(lr))) for lr in cfg.ablation.lrs]


def _plan_size(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [(f"size_{n}", with_changes(cfg, corpus__background_tokens=int(n))) for n in cfg.ablation.background_tokens]


def _plan_news(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [(f"news_{n}", with_changes(cfg, corpus__variant="news", corpus__news__n_background=int(n)))
            for n in cfg.ablation.news_background]


def _plan_occurrence(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [("occurrence", with_changes(cfg, corpus__occurrence="buckets"))]


def _plan_traps(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [("traps", with_changes(cfg, corpus__variant="traps", corpus__occurrence="buckets"))]


_CORPUS_SIZE = (("corpus.contamination_rate", _NUMBER), ("corpus.tokens.total", int),
                ("corpus.tokens.background", int))

# in the order of the paper (Table 4, Figure 5a, 5b, 5c): the order of the study's report and of the options
ABLATIONS: dict[str, Ablation] = {a.name: a for a in (
    Ablation("lr", _plan_lr, "lr_*", "lr_", (("config.train.lr", _NUMBER),), False, sweep_tables.lr_table,
             claims.lr_study),
    Ablation("size", _plan_size, "size_*", "size_", _CORPUS_SIZE, False, sweep_tables.size_table, claims.size_study),
    Ablation("news", _plan_news, "news_*", "news_", _CORPUS_SIZE, False, sweep_tables.news_table, claims.news_study),
    Ablation("occurrence", _plan_occurrence, "occurrence", "occurrence", (), True, sweep_tables.occurrence_table,
             claims.occurrence_study),
    # the copyright-trap study (Meeus et al. 2024; train/traps.py): after the paper's four
    Ablation("traps", _plan_traps, "traps", "traps", (), True, traps_tables.traps_table, traps_tables.traps_study),
)}


def plan(cfg: ExperimentConfig, ablation: str | None) -> list[tuple[str, ExperimentConfig]]:
    """(sub-folder, config) of every run of the sweep ``ablation`` ('' = the output folder itself: one run, when
    ``ablation`` is None)."""
    return [("", cfg)] if ablation is None else ABLATIONS[ablation].plan(cfg)


def folders_named() -> str:
    """The sub-folders of every ablation's runs, as messages list them: ``lr_*, size_*, news_* or occurrence``."""
    names = [a.folders for a in ABLATIONS.values()]
    return ", ".join(names[:-1]) + " or " + names[-1]


def _by_prefix(name: str) -> str | None:
    return next((a.name for a in ABLATIONS.values() if name.startswith(a.prefix)), None)


def recorded_kind(folder: Path, entries: dict) -> str | None:
    """The ablation a sweep folder's fingerprint records, when its manifest (``entries``) seals the fingerprint;
    None otherwise (a sweep made before the record, or not one of the registry)."""
    if rundir.FINGERPRINT not in entries:
        return None
    try:
        kind = json.loads((Path(folder) / rundir.FINGERPRINT).read_text(encoding="utf-8")).get("ablation")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None
    return kind if kind in ABLATIONS else None


def sweep_kind(folder: Path, entries: dict, subs: list[str]) -> str | None:
    """The ablation of the sweep in ``folder`` whose manifest holds ``entries`` and whose runs are the sub-folders
    ``subs``: the one its fingerprint records, else (the committed sweeps, made before that record) the one every
    sub-folder's name starts with; None when neither tells (no sub-folder, or names of several kinds)."""
    kind = recorded_kind(folder, entries)
    if kind is not None:
        return kind
    kinds = {_by_prefix(s) for s in subs}
    return kinds.pop() if subs and len(kinds) == 1 else None

"""The second passes of the multi-pass methods (``scorers.MULTI_PASS``), one per ``pass_kind``.

A multi-pass method is a composition of the same scoring path, never a second implementation of it: its pass
says which texts to read with which model (``lowercase``: the lowercased texts with the target model; ``ref``:
the texts with the reference model; ``neighbor``: every text's neighbours, flattened, with the target model) and
how to fold the per-text mean log-likelihoods of those records back onto the dataset's texts.
``runner.score_dataset`` runs each pass through ``runner.score_texts`` (into ``out_dir/passes/<method>.jsonl``,
resumable like the main pass) and hands the folded losses to the method's ``combine``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from mia_jax.engine.records import json_score
from mia_jax.evaluation.metrics import scores_by_method

Folded = tuple[np.ndarray, dict[int, str], dict[str, list]]


@dataclass
class Pass:
    """One second pass: ``texts`` to score with ``model`` (the single-pass ``methods``, default the method's
    ``pass_method``; each text after its prefix with ``prefixes``; ``compute`` instead of the forward + scorers,
    see ``runner.score_texts``), whether records of an interrupted run may be reused (``resume``), and ``fold``:
    the pass's records -> (a float64 [N] value per dataset text, NaN where there is none; {text index: why it is
    NaN}; per-record counts {field: [N]} to add to the final records)."""

    model: object
    texts: list[str]
    resume: bool
    fold: Callable[[list[dict]], Folded]
    methods: list[str] | None = None
    prefixes: list[str] | None = None
    compute: Callable | None = None


def method_values(recs: Sequence[dict], method: str = "loss") -> np.ndarray:
    return scores_by_method(recs, [method])[method] if recs else np.zeros(0)


def same_texts(model, texts: list[str], name: str, resume: bool, method: str = "loss", **kw) -> Pass:
    """One record per dataset text: the ``method`` score as it is; a text the pass skipped says why. ``kw``:
    the other ``Pass`` fields (``prefixes``, ``compute``, ``methods``)."""
    def fold(recs):
        reasons = {i: f"{name} pass: {r['skip_reason']}" for i, r in enumerate(recs) if "skip_reason" in r}
        return method_values(recs, method), reasons, {}

    return Pass(model, texts, resume, fold, **kw)


PASSES: dict[str, Callable[..., Pass]] = {}  # pass kind -> its builder; each method module registers its own


def register_pass(kind: str):
    """Register a second pass ``fn(name, loaded, texts, *, resume, method, **options) -> Pass`` under ``kind``
    (methods in their own modules add theirs: ``options`` are ``prepare``'s keyword arguments; from the runner
    also ``wanted``, the requested methods that read the pass)."""
    def deco(fn):
        if kind in PASSES:
            raise ValueError(f"pass kind {kind!r} is already registered")
        PASSES[kind] = fn
        return fn

    return deco


def prepare(pass_kind: str, name: str, loaded, texts: Sequence[str], *, ref=None, neighbors=None, out_dir=None,
            out_path=None, resume: bool = False, method: str = "loss", **options) -> Pass:
    """The second pass of kind ``pass_kind`` for the method ``name`` over ``texts``, folding the single-pass
    ``method`` score of its texts; ``options`` go to passes that take more (e.g. ReCaLL's prefix shots)."""
    if pass_kind not in PASSES:
        raise ValueError(f"unknown pass kind {pass_kind!r}; known: {', '.join(PASSES)}")
    return PASSES[pass_kind](name, loaded, texts, ref=ref, neighbors=neighbors, out_dir=out_dir, out_path=out_path,
                             resume=resume, method=method, **options)


def final_records(main: list[dict], methods: Sequence[str], extra: dict, counts: dict) -> list[dict]:
    """The dataset's records: the main pass's, with every method's score (a multi-pass method's from ``extra``:
    {method: (scores [N], {row: why NaN})}), ``nan_reasons`` where a multi-pass score is NaN for a text the main
    pass scored, and the passes' per-text ``counts`` ({record field: [N]})."""
    records = []
    for i, rec in enumerate(main):
        rec = dict(rec, scores={m: json_score(extra[m][0][i]) if m in extra else rec["scores"][m] for m in methods})
        nan_reasons = {m: why[i] for m, (_, why) in extra.items() if i in why and "skip_reason" not in rec}
        if nan_reasons:
            rec["nan_reasons"] = nan_reasons
        rec.update({k: v[i] for k, v in counts.items()})
        records.append(rec)
    return records

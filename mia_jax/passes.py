"""The second passes of the multi-pass methods (``scorers.MULTI_PASS``), one per ``pass_kind``.

A multi-pass method is a composition of the same scoring path, never a second implementation of it: its pass
says which texts to read with which model (``lowercase``: the lowercased texts with the target model; ``ref``:
the texts with the reference model; ``neighbor``: every text's neighbours, flattened, with the target model) and
how to fold the per-text mean log-likelihoods of those records back onto the dataset's texts.
``runner.score_dataset`` runs each pass through ``runner.score_texts`` (into ``out_dir/passes/<method>.jsonl``,
resumable like the main pass) and hands the folded losses to the method's ``combine``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mia_jax import neighbors as nb
from mia_jax import sharding as shd
from mia_jax.metrics import scores_by_method

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


def _values(recs: Sequence[dict], method: str = "loss") -> np.ndarray:
    return scores_by_method(recs, [method])[method] if recs else np.zeros(0)


def same_texts(model, texts: list[str], name: str, resume: bool, method: str = "loss", **kw) -> Pass:
    """One record per dataset text: the ``method`` score as it is; a text the pass skipped says why. ``kw``:
    the other ``Pass`` fields (``prefixes``, ``compute``, ``methods``)."""
    def fold(recs):
        reasons = {i: f"{name} pass: {r['skip_reason']}" for i, r in enumerate(recs) if "skip_reason" in r}
        return _values(recs, method), reasons, {}

    return Pass(model, texts, resume, fold, **kw)


def lowercase_pass(name: str, loaded, texts: Sequence[str], *, resume: bool, **_) -> Pass:
    """The target model on the lowercased texts."""
    return same_texts(loaded, [t.lower() for t in texts], name, resume)


def ref_pass(name: str, loaded, texts: Sequence[str], *, ref, resume: bool, **_) -> Pass:
    """The reference model (a LoadedModel with its own tokenizer) on the same texts."""
    return same_texts(ref, list(texts), name, resume)


def neighbor_pass(name: str, loaded, texts: Sequence[str], *, neighbors, out_dir, out_path, resume: bool,
                  method: str = "loss", **_) -> Pass:
    """The target model on every text's neighbours: from the generator ``neighbors`` (default
    ``neighbors.SelfNeighbors(loaded, n=10, seed=0)``; cached in ``out_dir/neighbors/``), those identical to their
    text dropped and counted, the rest flattened. Folded: per text the mean of its neighbours' mean
    log-likelihoods (NaN when none was scored, with the reason), and the counts ``n_neighbors`` (scored) and
    ``n_identical_neighbors`` (dropped). Records of an interrupted pass are reused only over the same neighbour
    texts (their SHA-256 is kept beside ``out_path``)."""
    generator = neighbors if neighbors is not None else nb.SelfNeighbors(loaded, n=10, seed=0)
    neigh = nb.cached_neighbors(generator, texts, Path(out_dir, "neighbors")) if out_dir else generator(texts)
    kept, n_identical = nb.drop_identical(texts, neigh)
    flat = [t for ns in kept for t in ns]
    owner = np.repeat(np.arange(len(texts)), [len(ns) for ns in kept]).astype(int)
    if out_path is not None:
        digest = Path(out_path).with_suffix(".sha256")
        h = hashlib.sha256(json.dumps(flat, ensure_ascii=False).encode("utf-8")).hexdigest()
        resume = resume and digest.exists() and digest.read_text().strip() == h
        shd.sync(f"neighbor digest read:{Path(out_path).name}")
        if shd.is_main_process():
            digest.write_text(h + "\n")

    def fold(recs):
        losses = _values(recs, method)
        mean = np.full(len(texts), np.nan)
        reasons: dict[int, str] = {}
        n_scored = [0] * len(texts)
        for i in range(len(texts)):
            ok = losses[owner == i]
            ok = ok[np.isfinite(ok)]
            n_scored[i] = int(ok.size)
            if ok.size:
                mean[i] = ok.mean()
            elif not neigh[i]:
                reasons[i] = f"{name}: {generator.name} gave no neighbours"
            elif not kept[i]:
                reasons[i] = (f"{name}: all {len(neigh[i])} neighbours are identical to the text "
                              "(no word could be replaced)")
            else:
                first = next(r for r, o in zip(recs, owner) if o == i)
                reasons[i] = (f"{name} pass: none of the {len(kept[i])} neighbours could be scored "
                              f"({first.get('skip_reason', 'no score')})")
        return mean, reasons, {"n_neighbors": n_scored, "n_identical_neighbors": n_identical}

    return Pass(loaded, flat, resume, fold)


PASSES: dict[str, Callable[..., Pass]] = {"lowercase": lowercase_pass, "ref": ref_pass, "neighbor": neighbor_pass}


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

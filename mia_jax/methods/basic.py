"""Multi-pass methods: a second run of the same scoring path on another text or another model.

Each is registered as a ``MultiPassMethod`` (its name, the kind of second pass it needs, and a ``combine``
function): a pure function of the main pass's mean log-likelihood (``loss``), the second pass's, and the texts,
returning the scores and, per row, the reason a score is NaN. The runner (``runner.score_dataset``) runs the
passes that ``mia_jax.engine.passes`` describes. For ``neighbor`` the second pass scores every text's neighbours
(``mia_jax.methods.neighbors``) and hands over, per text, the mean of their mean log-likelihoods.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.runs import processes
from mia_jax.engine import passes
from mia_jax.methods import neighbors as nb
from mia_jax.scorers.base import register_multi_pass


@register_multi_pass("lowercase", pass_kind="lowercase")
def lowercase(loss: np.ndarray, loss_lower: np.ndarray, texts: Sequence[str]):
    """log PPL(lowercased text) / log PPL(text), the published ratio with its sign flipped so that higher = member.

    log PPL = -loss (the mean token negative log-likelihood). A member's original casing is what the
    model memorised, so its log-perplexity is low relative to the lowercased text's. A text that
    lowercasing does not change (no upper-case letters) has no such contrast: NaN with a reason.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (-np.asarray(loss_lower)) / (-np.asarray(loss))
    reasons = {i: "lowercase: the text has no upper-case letters, lowercasing changes nothing"
               for i, t in enumerate(texts) if t.lower() == t}
    scores[list(reasons)] = np.nan
    return scores, reasons


@register_multi_pass("ref", pass_kind="ref")
def ref(loss: np.ndarray, loss_ref: np.ndarray, texts: Sequence[str]):
    """Target mean log-likelihood minus the reference model's (Carlini et al. 2021's Smaller-Ref calibration).

    Each model reads the text with its own tokenizer, so the two means may be over different tokens.
    """
    return np.asarray(loss) - np.asarray(loss_ref), {}


@register_multi_pass("neighbor", pass_kind="neighbor")
def neighbor(loss: np.ndarray, loss_neighbors: np.ndarray, texts: Sequence[str]):
    """Mean log-likelihood minus the mean over the text's neighbours' (Mattern et al. 2023's neighbourhood attack).

    ``loss_neighbors[i]`` is the mean, over text i's neighbours (a few words replaced, see
    ``mia_jax.methods.neighbors``), of each neighbour's mean token log-likelihood. A member is more likely under the
    model than texts saying nearly the same thing, so higher = member. No neighbour: NaN with a reason (the
    runner gives the specific one, e.g. every neighbour identical to the text).
    """
    loss_neighbors = np.asarray(loss_neighbors, np.float64)
    scores = np.asarray(loss, np.float64) - loss_neighbors
    reasons = {int(i): "neighbor: no neighbour could be scored" for i in np.flatnonzero(np.isnan(loss_neighbors))}
    return scores, reasons


# ---------------------------------------------------------------------------------- their second passes

@passes.register_pass("lowercase")
def lowercase_pass(name: str, loaded, texts: Sequence[str], *, resume: bool, **_) -> passes.Pass:
    """The target model on the lowercased texts."""
    return passes.same_texts(loaded, [t.lower() for t in texts], name, resume)


@passes.register_pass("ref")
def ref_pass(name: str, loaded, texts: Sequence[str], *, ref, resume: bool, **_) -> passes.Pass:
    """The reference model (a LoadedModel with its own tokenizer) on the same texts."""
    return passes.same_texts(ref, list(texts), name, resume)


@passes.register_pass("neighbor")
def neighbor_pass(name: str, loaded, texts: Sequence[str], *, neighbors, out_dir, out_path, resume: bool,
                  method: str = "loss", **_) -> passes.Pass:
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
        processes.sync(f"neighbor digest read:{Path(out_path).name}")
        if processes.is_main_process():
            digest.write_text(h + "\n")

    def fold(recs):
        losses = passes.method_values(recs, method)
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

    return passes.Pass(loaded, flat, resume, fold)

"""Multi-pass methods: a second run of the same scoring path on another text or another model.

Each is registered as a ``MultiPassMethod`` (its name, the kind of second pass it needs, and a ``combine``
function): a pure function of the main pass's mean log-likelihood (``loss``), the second pass's, and the texts,
returning the scores and, per row, the reason a score is NaN. The runner (``runner.score_dataset``) runs the
passes that ``mia_jax.passes`` describes. For ``neighbor`` the second pass scores every text's neighbours
(``mia_jax.neighbors``) and hands over, per text, the mean of their mean log-likelihoods.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

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
    ``mia_jax.neighbors``), of each neighbour's mean token log-likelihood. A member is more likely under the
    model than texts saying nearly the same thing, so higher = member. No neighbour: NaN with a reason (the
    runner gives the specific one, e.g. every neighbour identical to the text).
    """
    loss_neighbors = np.asarray(loss_neighbors, np.float64)
    scores = np.asarray(loss, np.float64) - loss_neighbors
    reasons = {int(i): "neighbor: no neighbour could be scored" for i in np.flatnonzero(np.isnan(loss_neighbors))}
    return scores, reasons

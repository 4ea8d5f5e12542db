"""Multi-pass scorers: a second run of the same scoring path on another text or another model.

Each is a pure function of the main pass's mean log-likelihood (``loss``), the second pass's, and
the texts; the runner (``runner.score_dataset``) runs the passes. It returns the scores and, per
row, the reason a score is NaN.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.scorers.base import register


@register("lowercase", extra_pass="lowercase")
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


@register("ref", extra_pass="ref")
def ref(loss: np.ndarray, loss_ref: np.ndarray, texts: Sequence[str]):
    """Target mean log-likelihood minus the reference model's (Carlini et al. 2021's Smaller-Ref calibration).

    Each model reads the text with its own tokenizer, so the two means may be over different tokens.
    """
    return np.asarray(loss) - np.asarray(loss_ref), {}

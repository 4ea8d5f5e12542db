"""CAMIA's repeat signal (Chang et al., EMNLP 2025): a text's mean log-likelihood minus that of its second reading
after itself (``camia_repeat``), a second pass of the scoring path; the single-pass CAMIA signals and the paper's
notation are in :mod:`mia_jax.scorers.camia`."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.engine import passes
from mia_jax.scorers.base import register_multi_pass


@passes.register_pass("repeat")
def repeat_pass(name, loaded, texts, *, resume, method="loss", **_) -> passes.Pass:
    """The target model on every text read after itself, only the second copy scored; with ``loss`` on a tokenizer
    without BOS the second copy's first token is left out (``camia_ll_tail``) so that both passes mean over the same
    tokens. A text read with no token of its first copy before it (it alone fills the context) is NaN with the
    reason."""
    scored = "camia_ll_tail" if method == "loss" and not loaded.add_bos else method
    base = passes.same_texts(loaded, list(texts), name, resume, scored, prefixes=list(texts), methods=[scored])
    inner, bos = base.fold, int(bool(loaded.add_bos))

    def fold(recs):
        values, reasons, counts = inner(recs)
        values = np.array(values, np.float64)
        for i, rec in enumerate(recs):  # a context of at most a BOS holds nothing of the first copy
            if "skip_reason" not in rec and rec.get("n_context", 0) - bos < 1:
                values[i] = np.nan
                reasons[i] = (f"{name} pass: the text alone (nearly) fills the model's context of "
                              f"{loaded.max_length} tokens, so it cannot be read after itself")
        return values, reasons, counts

    base.fold = fold
    return base


@register_multi_pass("camia_repeat", pass_kind="repeat", pass_method="loss")
def camia_repeat(loss: np.ndarray, loss_repeat: np.ndarray, texts: Sequence[str]):
    """CAMIA repeat: LL(x) - LL(x | x), the text's mean log-likelihood minus that of its second reading.

    A member is predicted well already, so it gains less from reading itself again: a higher score."""
    return np.asarray(loss, np.float64) - np.asarray(loss_repeat, np.float64), {}

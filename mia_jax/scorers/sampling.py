"""SaMIA (Kaneko et al. 2024) as registered methods: ``samia`` and ``samia_zlib`` from one sampling pass.

The pass (kind ``samia``) draws ``n_samples`` continuations of each text's first half with the KV cache and scores
them against the true second half (``mia_jax.samia``: the formulas, the authors' code and where this differs).
It runs through ``runner.score_texts``' batching and resumable records like every other pass (``compute``), so
both methods come from the same samples and an interrupted run keeps its finished batches. Options
(``pass_options["samia"]``): ``n_samples``, ``prefix_ratio``, ``max_new_tokens``, ``temperature``, ``top_k``,
``seed``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax import passes
from mia_jax.metrics import scores_by_method
from mia_jax.scorers.base import register_multi_pass

METHODS = ("samia", "samia_zlib")


@passes.register_pass("samia")
def samia_pass(name, loaded, texts, *, resume, samia=None, **_) -> passes.Pass:
    """Every text's samples scored in batches; folded to a [N, 2] array (samia, samia_zlib), NaN with the reason
    where a text has no prefix or no continuation to compare with."""
    from mia_jax import samia as sm  # ~15 ms (generate, tqdm): not at `import mia_jax`, only when SaMIA runs

    opts = dict(samia or {})
    ratio = opts.get("prefix_ratio", 0.5)

    def compute(ids, mask, batch_texts):
        return sm.samia_scores(loaded, batch_texts, progress=False, **opts)[0]

    def fold(recs):
        values = scores_by_method(recs, list(METHODS))
        reasons = {}
        for i, t in enumerate(texts):
            why = recs[i].get("skip_reason") or sm.skip_reason(t, ratio)
            if why:
                reasons[i] = f"{name}: {why}"
        return np.stack([values[m] for m in METHODS], 1), reasons, {}

    return passes.Pass(loaded, list(texts), resume, fold, methods=list(METHODS), compute=compute)


@register_multi_pass("samia", pass_kind="samia")
def samia(loss: np.ndarray, both: np.ndarray, texts: Sequence[str]):
    """SaMIA: mean ROUGE-1 recall of sampled continuations of the text's first half against its second half."""
    return np.asarray(both, np.float64)[:, 0], {}


@register_multi_pass("samia_zlib", pass_kind="samia")
def samia_zlib(loss: np.ndarray, both: np.ndarray, texts: Sequence[str]):
    """SaMIA*zlib: the same, each sample's ROUGE-1 recall times its zlib-compressed length."""
    return np.asarray(both, np.float64)[:, 1], {}

"""The mean over groups (e.g. a table's datasets or lengths) of one method's AUROC and TPR@5%FPR with stratified
bootstrap intervals (:func:`evaluate_mean`: a table's average column), and the check every grouped statistic makes
first (:func:`enough_per_class`). Re-exported by :mod:`mia_jax.evaluation.comparisons`, whose paired comparisons draw
the same resamples."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.evaluation.bootstrap import (MIN_PER_CLASS, as_labels, as_scores, group_rows, grouped_bootstrap, interval,
                                          too_few, tpr_key)


def enough_per_class(rows, keys, minimum: int = MIN_PER_CLASS) -> None:
    """ValueError naming the first group (or the whole set, one group) with fewer than ``minimum`` examples of a
    class: ``rows`` [(member rows, non-member rows)] per group of ``keys`` (:func:`bootstrap.group_rows`)."""
    for key, (pos, neg) in zip(keys, rows):
        if reason := too_few(len(pos), len(neg), minimum):
            raise ValueError(reason if len(keys) == 1 else f"{key}: {reason}")


def evaluate_mean(labels, scores, groups: Sequence, *, n_bootstrap: int = 1000, seed: int = 0,
                  confidence: float = 0.95, min_per_class: int = MIN_PER_CLASS, fpr: float = 0.05) -> dict:
    """The mean over ``groups`` (e.g. datasets) of one method's per-group AUROC and TPR@``fpr`` (5%), with stratified
    percentile-bootstrap intervals (resampled within each group, members and non-members separately; the same
    draws as :func:`paired_bootstrap` with the same ``seed``). NaN/inf scores are excluded (``n_nan``).

    ``scores`` may also be several score vectors on the **same** examples, shape ``[V, n]`` (e.g. one method
    under two models on the same texts): the statistic is then the mean over vectors and groups, and every
    resample is shared by all vectors, so the interval of a table's "average over models" column accounts for
    the vectors being scored on the same texts. An example whose score is NaN/inf in any vector is dropped from all.
    ``{"auroc", "auroc_ci", "tpr_at_5pct_fpr", "tpr_at_5pct_fpr_ci", "n_groups", "n_nan"}`` (the TPR's keys
    named by ``bootstrap.tpr_key(fpr)``: ``tpr_at_1pct_fpr`` for 0.01); intervals ``None`` when
    ``n_bootstrap == 0``."""
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    lab = as_labels(labels)
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != lab.shape[0]):
        raise ValueError(f"scores must have shape [n] or [V, n] with n = {lab.shape[0]} labels, got {arr.shape}")
    vectors = [as_scores(v, lab.shape[0]) for v in np.atleast_2d(arr)]
    tpr = tpr_key(fpr)
    keep = np.logical_and.reduce([np.isfinite(v) for v in vectors])
    keys, rows = group_rows(lab[keep], [g for g, k in zip(groups, keep) if k], int(keep.sum()))
    try:
        enough_per_class(rows, keys, min_per_class)
    except ValueError as e:
        return {"auroc": None, "auroc_ci": None, tpr: None, f"{tpr}_ci": None,
                "n_groups": len(keys), "n_nan": int((~keep).sum()), "note": str(e)}
    auc, rate, boot_auc, boot_rate = grouped_bootstrap([v[keep] for v in vectors], rows, n_bootstrap, seed, fpr)
    return {"auroc": float(auc.mean()),
            "auroc_ci": interval(boot_auc.mean(axis=1), confidence) if n_bootstrap else None,
            tpr: float(rate.mean()),
            f"{tpr}_ci": interval(boot_rate.mean(axis=1), confidence) if n_bootstrap else None,
            "n_groups": len(keys), "n_nan": int((~keep).sum())}

"""The blind baseline (Das, Zhang & Tramèr 2024): detect "members" without any model.

A bag-of-words classifier (TF-IDF of word unigrams and bigrams + logistic regression) is trained
to tell members from non-members by their text alone, with seeded stratified k-fold
cross-validation; every text is scored by the fold model that did not see it. If it separates the
two sets well (AUROC above ``WARN_AUROC``), members and non-members differ in distribution (topic,
dates, style) and detector AUROCs on that benchmark overstate the membership signal.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline

from mia_jax.errors import UserError

NAME = "blind_bow"
WARN_AUROC = 0.6
FOLDS = 5


def blind_bow_scores(texts: Sequence[str], labels: Sequence[int], *, folds: int = FOLDS, seed: int = 0) -> np.ndarray:
    """Out-of-fold member probabilities (higher = member) of a model-free bag-of-words classifier."""
    y = np.asarray(labels, int)
    smallest = min(int(y.sum()), int(len(y) - y.sum()))
    if smallest < folds:
        raise UserError(f"the blind baseline needs at least {folds} members and {folds} non-members "
                        f"for {folds}-fold cross-validation; the smaller class has {smallest}")
    pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True),
                         LogisticRegression(C=10.0, max_iter=2000))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return cross_val_predict(pipe, list(texts), y, cv=cv, method="predict_proba")[:, 1]


def warning(auroc: float | None) -> str | None:
    if auroc is not None and auroc > WARN_AUROC:
        return (f"WARNING: a model-free bag-of-words classifier reaches AUROC {auroc:.3f} > {WARN_AUROC} on this "
                "benchmark: members and non-members differ in distribution, so detector AUROCs here overstate "
                "the membership signal (Das et al. 2024).")
    return None

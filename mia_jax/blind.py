"""The blind baseline (Das, Zhang & Tramèr 2024): detect "members" without any model.

A bag-of-words classifier (TF-IDF of word unigrams and bigrams + logistic regression) is trained
to tell members from non-members by their text alone, with seeded stratified k-fold
cross-validation; every text is scored by the fold model that did not see it (with ``groups``, e.g. the windows of
one text in online detection, a group's texts all fall in one fold). If it separates the
two sets well (AUROC above ``WARN_AUROC``), members and non-members differ in distribution (topic,
dates, style) and detector AUROCs on that benchmark overstate the membership signal.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.errors import UserError

NAME = "blind_bow"
WARN_AUROC = 0.6
FOLDS = 5


def assign_folds(labels: Sequence[int], *, folds: int = FOLDS, seed: int = 0, groups: Sequence | None = None,
                 ) -> np.ndarray:
    """The cross-validation fold (0 .. ``folds`` - 1) of each text: seeded stratified k-fold, or with ``groups``
    stratified *group* k-fold (``StratifiedGroupKFold``), every text of a group in the same fold."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold  # here: scikit-learn is slow to import

    y = np.asarray(labels, int)
    smallest = min(int(y.sum()), int(len(y) - y.sum()))
    if smallest < folds:
        raise UserError(f"the blind baseline needs at least {folds} members and {folds} non-members "
                        f"for {folds}-fold cross-validation; the smaller class has {smallest}")
    if groups is None:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    else:
        groups = np.asarray(groups)
        if groups.shape != y.shape:
            raise UserError(f"the blind baseline got {groups.size} groups for {y.size} texts")
        n_groups = len(set(groups.tolist()))
        if n_groups < folds:
            raise UserError(f"the blind baseline needs at least {folds} groups (texts) for {folds}-fold grouped "
                            f"cross-validation; got {n_groups}")
        per_class = [len(set(groups[y == c].tolist())) for c in (1, 0)]
        if min(per_class) < folds:
            raise UserError(f"the blind baseline needs members and non-members each in at least {folds} groups "
                            f"(texts); members are in {per_class[0]}, non-members in {per_class[1]}")
        cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    out = np.full(y.size, -1, np.int64)
    for k, (_, test) in enumerate(cv.split(np.zeros(y.size), y, groups)):
        out[test] = k
    return out


def blind_bow_scores(texts: Sequence[str], labels: Sequence[int], *, folds: int = FOLDS, seed: int = 0,
                     groups: Sequence | None = None) -> np.ndarray:
    """Out-of-fold member probabilities (higher = member) of a model-free bag-of-words classifier; the folds are
    :func:`assign_folds`'.

    ``groups`` (one key per text, e.g. the index of the document a window was cut from): all texts of a group fall
    in the same fold. The windows of one document share its vocabulary (names, dates, topic words); were they split
    over folds, a fold model would have seen the very document it scores (from its other windows), and the baseline
    would overstate how separable members and non-members are."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # here, as above: the CLI's start-up
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import PredefinedSplit, cross_val_predict
    from sklearn.pipeline import make_pipeline

    y = np.asarray(labels, int)
    fold = assign_folds(y, folds=folds, seed=seed, groups=groups)
    pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True),
                         LogisticRegression(C=10.0, max_iter=2000))
    return cross_val_predict(pipe, list(texts), y, cv=PredefinedSplit(fold), method="predict_proba")[:, 1]


def warning(auroc: float | None) -> str | None:
    """The warning printed when the blind baseline's ``auroc`` exceeds ``WARN_AUROC``, else None."""
    if auroc is not None and auroc > WARN_AUROC:
        return (f"WARNING: a model-free bag-of-words classifier reaches AUROC {auroc:.3f} > {WARN_AUROC} on this "
                "benchmark: members and non-members differ in distribution, so detector AUROCs here overstate "
                "the membership signal (Das et al. 2024).")
    return None

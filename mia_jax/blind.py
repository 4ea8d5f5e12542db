"""The blind baseline (Das, Zhang & Tramèr 2024): detect "members" without any model.

A bag-of-words classifier (TF-IDF of word unigrams and bigrams + logistic regression) is trained
to tell members from non-members by their text alone, with seeded stratified k-fold
cross-validation; every text is scored by the fold model that did not see it (with ``groups``, e.g. the windows of
one text in online detection, a group's texts all fall in one fold). If it separates the
two sets well (AUROC above ``WARN_AUROC``), members and non-members differ in distribution (topic,
dates, style) and detector AUROCs on that benchmark overstate the membership signal.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.errors import UserError

NAME = "blind_bow"
WARN_AUROC = 0.6
FOLDS = 5
CHILD_MIN_TEXTS = 200  # from this many texts an eval computes the baseline in a child process (``Child``)


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


class Child:
    """:func:`blind_bow_scores` (no groups) computed in a child process, ``python -m mia_jax.blind``, started now.

    The eval starts it before the model loads: the baseline is pure-Python work under scikit-learn (its import, the
    TF-IDF, the L-BFGS loop; the child took 2.2-2.3 s for WikiMIA-32's 776 texts) that on a thread of the eval's own
    would hold the interpreter lock the model load needs, while a process of its own runs on the core the
    single-threaded load leaves idle. The child has a session of its own (a Ctrl-C reaches the eval alone) and is
    killed when the eval's main thread ends first."""

    def __init__(self, texts: Sequence[str], labels: Sequence[int], *, seed: int = 0):
        root = str(Path(__file__).resolve().parents[1])  # the child imports this very package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
               **{f"{lib}_NUM_THREADS": "1" for lib in ("OMP", "OPENBLAS", "MKL")}}  # one core: XLA has the rest
        self._input = json.dumps({"texts": list(texts), "labels": [int(y) for y in labels], "seed": int(seed)})
        self._proc = subprocess.Popen([sys.executable, "-m", "mia_jax.blind"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                      start_new_session=True)

    def scores(self) -> np.ndarray:
        """The child's scores, waiting for them; a ``UserError`` as :func:`blind_bow_scores` raises it, and a
        ``RuntimeError`` (with the child's last line of stderr) when the child failed otherwise."""
        feed = self._input.encode()
        while True:
            try:
                out, err = self._proc.communicate(feed, timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                feed = None  # sent: a retry only waits and reads
                if not threading.main_thread().is_alive():  # the eval is exiting (an error, a Ctrl-C)
                    self._proc.kill()
                    self._proc.communicate()
                    raise RuntimeError("the eval ended before the blind baseline's process") from None
        if self._proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the blind baseline's process exited with code {self._proc.returncode}: {last}")
        result = json.loads(out)
        if "error" in result:
            raise UserError(result["error"])
        return np.asarray(result["scores"], np.float64)


def _main() -> None:
    """``Child``'s process: {"texts", "labels", "seed"} as JSON on stdin -> {"scores": [...]} or {"error": the
    UserError's message} as JSON on stdout (floats written by ``repr``: the parent reads the same float64s). Not a
    command: the eval's child, which writes nothing but its stdout; a failure here reaches the eval as a
    ``RuntimeError`` and the eval computes the baseline itself."""
    job = json.load(sys.stdin)
    try:
        result = {"scores": blind_bow_scores(job["texts"], job["labels"], seed=job["seed"]).tolist()}
    except UserError as e:
        result = {"error": str(e)}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    _main()
